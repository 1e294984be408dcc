"""The fault rank double-forks a daemon into its own session, between two of the launcher's
process scans, and every test passes. The daemon writes its pid to $DCPQUAL_DAEMON_PIDFILE and,
where $DCPQUAL_DAEMON_NAME is set, takes that process name (posing as another process)."""

from __future__ import annotations

import os
import time

import torch.distributed as dist
from _world import all_reduce_sum, fault_rank, rank


def test_starts_a_daemon_and_passes():
    if rank() == fault_rank():
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                if name := os.environ.get("DCPQUAL_DAEMON_NAME"):
                    with open("/proc/self/comm", "w") as comm:
                        comm.write(name)
                path = os.environ["DCPQUAL_DAEMON_PIDFILE"]
                with open(path + ".tmp", "w") as fh:
                    fh.write(str(os.getpid()))
                os.rename(path + ".tmp", path)
                time.sleep(600)
            os._exit(0)
        os.wait()  # the middle process is gone: the daemon is nobody's child in the rank
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_after():
    dist.barrier()
