"""One forked rank SIGKILLs a process between it and its torchrun agent mid-test:
`DCPQUAL_KILL=zygote` its parent (the zygote that forked every rank), `DCPQUAL_KILL=stub` the
fork stub torchrun started for it; `DCPQUAL_KILL_HOW=group` signals that process's group instead
(each leads its own), the zygote's the natural way: `os.killpg(os.getpgid(os.getppid()))`.
Either ends the job; the one that did it is the root cause."""

from __future__ import annotations

import os
import signal

import torch.distributed as dist
from _world import all_reduce_sum, fault_rank, rank

from harness.rank.parentage import parentage


def test_before():
    assert parentage().forked, "this suite needs ranks forked from the zygote"
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_fault():
    if rank() == fault_rank():
        above = parentage()
        assert above.zygote == os.getppid(), above
        target = above.zygote if os.environ["DCPQUAL_KILL"] == "zygote" else above.stub
        assert target is not None, above
        if os.environ.get("DCPQUAL_KILL_HOW") != "group":
            os.kill(target, signal.SIGKILL)
        elif target == os.getppid():
            os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)
        else:
            os.kill(-os.getpgid(target), signal.SIGKILL)
    all_reduce_sum(1.0)


def test_after():
    dist.barrier()
