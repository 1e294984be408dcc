"""A test leaves a (non-daemon) thread running and passes: the rank's records and JUnit report
are final once pytest is done, so the rank ends then, not when the thread would."""

from __future__ import annotations

import threading
import time

import torch.distributed as dist


def test_leaves_a_thread_running():
    threading.Thread(target=time.sleep, args=(600,), name="left-running").start()
    dist.barrier()
