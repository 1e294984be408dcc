"""One rank is SIGKILLed mid-test, after starting a helper process that it leaves orphaned.

The helper (its own session, like a compile worker or a server a test starts) must not outlive
the run: the launcher saw it while the rank was alive and ends it after torchrun exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch.distributed as dist
from _world import all_reduce_sum, fault_rank, rank

# Long enough that the launcher's process scan (every 0.5 s) has seen the helper.
HELPER_SEEN_S = 1.5


def test_before():
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_fault():
    if rank() == fault_rank():
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(HELPER_SEEN_S)
        os.kill(os.getpid(), signal.SIGKILL)
    all_reduce_sum(1.0)


def test_after():
    dist.barrier()
