"""The fault rank starts a helper that leaves its session and keeps re-forking (each parent
exits, each child sleeps 5 ms and forks again), optionally moving itself to the root cgroup
first ($DCPQUAL_REFORK_ESCAPE), and every test passes. Each incarnation appends its pid to
$DCPQUAL_REFORK_PIDS, so the test that launched the run can look for all of them."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import torch.distributed as dist
from _world import all_reduce_sum, fault_rank, rank


def _escape_cgroup() -> None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            with contextlib.suppress(OSError):
                (Path(fields[1]) / "cgroup.procs").write_text("0")
            return


def _refork_forever() -> None:
    os.setsid()
    if os.environ.get("DCPQUAL_REFORK_ESCAPE"):
        _escape_cgroup()
    pids = os.environ["DCPQUAL_REFORK_PIDS"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open(pids, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(0.005)
        if os.fork() != 0:
            os._exit(0)
    os._exit(0)


def test_starts_a_reforking_helper_and_passes():
    if rank() == fault_rank():
        if os.fork() == 0:
            _refork_forever()
        time.sleep(0.2)
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_after():
    dist.barrier()
