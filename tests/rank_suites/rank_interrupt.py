"""Every rank finishes one test, spills the run's HF_TOKEN, then waits in a long test until the
test that launched the run interrupts the launcher (^C or SIGTERM)."""

from __future__ import annotations

import os
import time

import torch.distributed as dist
from _world import all_reduce_sum

TOKEN = os.environ.get("HF_TOKEN", "")


def test_before():
    print(f"HF_TOKEN={TOKEN}")
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_waits_for_the_interrupt():
    time.sleep(600)


def test_after():
    dist.barrier()
