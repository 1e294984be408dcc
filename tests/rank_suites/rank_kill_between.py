"""One forked rank SIGKILLs the process between it and its torchrun agent mid-test: its parent,
the agent's forkserver that forked every rank; `DCPQUAL_KILL_HOW=group` signals its parent's
group instead, the natural way: `os.killpg(os.getpgid(os.getppid()))` (the agent's group, which
the forkserver shares). Either ends the job; the one that did it is the root cause."""

from __future__ import annotations

import os
import signal

import torch.distributed as dist
from _world import all_reduce_sum, fault_rank, rank

from harness.rank.parentage import parentage


def test_before():
    assert parentage().forked, "this suite needs ranks forked by the agent's forkserver"
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_fault():
    if rank() == fault_rank():
        above = parentage()
        assert above.forkserver == os.getppid(), above
        if os.environ.get("DCPQUAL_KILL_HOW") != "group":
            os.kill(above.forkserver, signal.SIGKILL)
        else:
            os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)
    all_reduce_sum(1.0)


def test_after():
    dist.barrier()
