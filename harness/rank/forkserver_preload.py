"""The forkserver's preload (`harness.launch.agent` names this module its only one): imported by
multiprocessing's forkserver before it forks any rank, it runs `harness.rank.preload.preload` on
the list the agent put in its environment, keeps what that did for each rank it forks
(`harness.rank.forkserved` hands the warnings over, as the zygote's child does), and tells what
failed to import on the agent's log, where the forkserver's stderr goes.

Imported anywhere else (no list in the environment) it preloads nothing.
"""

from __future__ import annotations

import os
import sys

from harness.rank.preload import PRELOAD_LIST_ENV, Preloaded, preload


def _preload_here() -> Preloaded | None:
    listed = os.environ.pop(PRELOAD_LIST_ENV, None)  # the ranks' environments never carry it
    if listed is None:
        return None
    done = preload(tuple(m for m in listed.split(",") if m))
    for failed in done.failed:
        line = f"dcpqual forkserver: not preloaded: {failed.module}: {failed.error}"
        print(line, file=sys.stderr)
    sys.stderr.flush()
    return done


PRELOADED: Preloaded | None = _preload_here()
