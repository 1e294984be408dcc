"""One rank hangs in its own code; its peers wait for it inside a collective."""

from __future__ import annotations

import time

import torch.distributed as dist
from _world import all_reduce_sum, fault_rank, rank


def test_before():
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_fault():
    if rank() == fault_rank():
        time.sleep(3600)
    all_reduce_sum(1.0)


def test_after():
    dist.barrier()
