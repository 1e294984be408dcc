"""Every rank double-forks a daemon into its own session, between two of the launcher's process
scans, and every test passes. Each daemon writes its pid to $DCPQUAL_DAEMON_PIDS/rank-N; rank 1's
takes the process name $DCPQUAL_DAEMON_NAME where it is set (posing as another process)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch.distributed as dist
from _world import all_reduce_sum, rank


def test_starts_a_daemon_and_passes():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            if rank() == 1 and (name := os.environ.get("DCPQUAL_DAEMON_NAME")):
                with open("/proc/self/comm", "w") as comm:
                    comm.write(name)
            path = Path(os.environ["DCPQUAL_DAEMON_PIDS"]) / f"rank-{rank()}"
            path.with_suffix(".tmp").write_text(str(os.getpid()))
            path.with_suffix(".tmp").rename(path)
            time.sleep(600)
        os._exit(0)
    os.wait()  # the middle process is gone: the daemon is nobody's child in the rank
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_after():
    dist.barrier()
