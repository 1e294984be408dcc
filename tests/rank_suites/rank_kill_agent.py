"""One rank SIGKILLs its torchrun agent mid-test; every rank, itself included, is then an orphan
that its watchdog ends, so the one that did it must be told apart by what it did. The agent is
the harness's answer (`agent_pid`): the rank's parent where torchrun started it, the
forkserver's parent where the agent's forkserver forked it."""

from __future__ import annotations

import os
import signal

import torch.distributed as dist
from _world import all_reduce_sum, fault_rank, rank

from harness.rank.parentage import agent_pid


def test_before():
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_fault():
    if rank() == fault_rank():
        os.kill(agent_pid(), signal.SIGKILL)
    all_reduce_sum(1.0)


def test_after():
    dist.barrier()
