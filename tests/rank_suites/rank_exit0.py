"""One rank leaves mid-test with exit code 0 (`os._exit(0)`); its peers wait in a collective for
it. torchrun sees a successful worker and keeps waiting; only the launcher can notice."""

from __future__ import annotations

import os
import time

import torch.distributed as dist
from _world import all_reduce_sum, fault_rank, rank


def test_before():
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_fault():
    if rank() == fault_rank():
        time.sleep(0.3)
        os._exit(0)
    all_reduce_sum(1.0)


def test_after():
    dist.barrier()
