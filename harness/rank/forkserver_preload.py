"""The forkserver's preload (`harness.launch.agent` names this module its only one): imported by
the agent before it forks multiprocessing's forkserver from itself (or, where it may not fork,
by the fresh forkserver it starts instead), it runs `harness.rank.preload.preload` on the list
the agent put in its environment, keeps what that did for each rank the server forks
(`harness.rank.forkserved` hands the warnings over), and tells what failed to import and how
long it took on the agent's log, where the agent's and the forkserver's stderr go.

Imported anywhere else (no list in the environment) it preloads nothing.
"""

from __future__ import annotations

import os
import re
import sys
import time

from harness.rank.preload import PRELOAD_LIST_ENV, Preloaded, preload

# The line it ends its preload with on the agent's log (the bench reads the seconds back).
READY = "dcpqual forkserver: {count} modules preloaded in {seconds:.1f}s"
READY_LINE = re.compile(
    r"^dcpqual forkserver: \d+ modules preloaded in (?P<seconds>[\d.]+)s$", re.M
)


def preload_seconds(agent_log: str) -> float | None:
    """The seconds the forkserver's preload took, from its line on the agent's log (None: no
    forkserver said it was done: one rank, or cold ranks)."""
    found = READY_LINE.search(agent_log)
    return None if found is None else float(found["seconds"])


def _preload_here() -> Preloaded | None:
    listed = os.environ.pop(PRELOAD_LIST_ENV, None)  # the ranks' environments never carry it
    if listed is None:
        return None
    started = time.monotonic()
    done = preload(tuple(m for m in listed.split(",") if m))
    for failed in done.failed:
        line = f"dcpqual forkserver: not preloaded: {failed.module}: {failed.error}"
        print(line, file=sys.stderr)
    seconds = time.monotonic() - started
    print(READY.format(count=len(done.loaded), seconds=seconds), file=sys.stderr)
    sys.stderr.flush()
    return done


PRELOADED: Preloaded | None = _preload_here()
