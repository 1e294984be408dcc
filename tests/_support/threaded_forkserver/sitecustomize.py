"""On PYTHONPATH, this leaves a thread running in the agent's forkserver (and nowhere else), as a
preload that starts a thread pool would: the forkserver may then fork no rank, and the agent
starts them cold (`harness.rank.forksafety`)."""

import sys
import threading

if "from multiprocessing.forkserver import main" in " ".join(sys.orig_argv):
    threading.Thread(target=threading.Event().wait, daemon=True, name="left-running").start()
