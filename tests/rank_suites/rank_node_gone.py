"""Every rank finishes one test, then keeps meeting its peers in barriers until the test that
launched the run kills node 0's agent: node 1's rank then fails in a barrier its dead peer left."""

from __future__ import annotations

import time

import torch.distributed as dist
from _world import all_reduce_sum


def test_before():
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_meets_its_peers_until_node_0_is_gone():
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        dist.barrier()
        time.sleep(0.2)
