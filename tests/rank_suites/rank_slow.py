"""The fault rank is slow in its own code (no collective): its peers finish the test and wait
for it in the agreement, which the progress line can name."""

from __future__ import annotations

import time

import torch.distributed as dist
from _world import fault_rank, rank


def test_quick():
    dist.barrier()


def test_slow_on_the_fault_rank():
    if rank() == fault_rank():
        time.sleep(4.0)


def test_after():
    dist.barrier()
