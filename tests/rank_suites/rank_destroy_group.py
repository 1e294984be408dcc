"""One rank destroys its default process group mid-test; its peer, waiting in a collective on
it, sees that collective fail (often before the rank that did it reports anything)."""

from __future__ import annotations

import torch.distributed as dist
from _world import all_reduce_sum, fault_rank, rank


def test_before():
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_fault():
    if rank() == fault_rank():
        dist.destroy_process_group()
        return
    all_reduce_sum(1.0)


def test_after():
    dist.barrier()
