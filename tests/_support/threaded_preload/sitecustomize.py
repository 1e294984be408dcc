"""On PYTHONPATH, this leaves a thread running where the ranks' preload is done, as a preload
that starts a thread pool would: in the agent (which then starts a fresh forkserver instead of
forking itself) and, unless `DCPQUAL_TEST_THREAD_IN` says `agent` alone, in that fresh
forkserver too (which may then fork no rank: the agent starts them cold,
`harness.rank.forksafety`)."""

import os
import sys
import threading

_ARGV = " ".join(sys.orig_argv)
_WHERE = os.environ.get("DCPQUAL_TEST_THREAD_IN", "agent,forkserver").split(",")
if ("agent" in _WHERE and "harness.launch.agent" in _ARGV) or (
    "forkserver" in _WHERE and "from multiprocessing.forkserver import main" in _ARGV
):
    threading.Thread(target=threading.Event().wait, daemon=True, name="left-running").start()
