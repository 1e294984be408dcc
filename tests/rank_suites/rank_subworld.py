"""Sub-world cases of sizes 1 and 2 on 4 ranks: the rank plugin runs the size-1 cases on ranks
0-1 and the size-2 cases on ranks 2-3, side by side. The fault rank (3 here) fails the second
size-2 case: its lane stops there and, after the block, the whole run stops."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _world import fault_rank, rank

_groups: dict[int, dist.ProcessGroup] = {}


def group(size: int) -> dist.ProcessGroup:
    """This rank's group of `size`; every size is created on the first request (collective)."""
    if not _groups:
        for each in (1, 2):
            _groups[each] = dist.new_subgroups(group_size=each)[0]
    return _groups[size]


def summed_in_group(size: int) -> float:
    value = torch.ones(1)
    dist.all_reduce(value, group=group(size))
    return float(value.item())


@pytest.mark.subworld(size=1)
@pytest.mark.parametrize("case", range(3))
def test_alone(case):
    assert rank() in (0, 1), f"a size-1 case ran on rank {rank()}"
    assert summed_in_group(1) == 1.0


@pytest.mark.subworld(size=2)
@pytest.mark.parametrize("case", range(3))
def test_in_pairs(case):
    assert rank() in (2, 3), f"a size-2 case ran on rank {rank()}"
    assert summed_in_group(2) == 2.0
    assert not (case == 1 and rank() == fault_rank()), f"injected failure on rank {rank()}"


def test_after_the_block():
    dist.barrier()
