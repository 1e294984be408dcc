"""One rank fails an assertion before a collective its peers are already waiting in."""

from __future__ import annotations

import torch.distributed as dist
from _world import all_reduce_sum, fault_rank, rank


def test_before():
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_fault():
    assert rank() != fault_rank(), f"injected assertion on rank {rank()}"
    all_reduce_sum(1.0)


def test_after():
    dist.barrier()
