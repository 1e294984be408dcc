"""One rank hangs inside a collective its peers never join; they finish the test and wait."""

from __future__ import annotations

import torch.distributed as dist
from _world import all_reduce_sum, fault_rank, rank


def test_before():
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_fault():
    if rank() == fault_rank():
        all_reduce_sum(1.0)  # nobody else joins: blocks until the per-test timeout


def test_after():
    dist.barrier()
