"""Each rank says who it is on stdout and stderr (run with `-s`), so a log can be matched to
the global rank that wrote it."""

from __future__ import annotations

import os
import sys

from _world import rank


def test_say_who_i_am():
    local = os.environ["LOCAL_RANK"]
    print(f"whoami: global rank {rank()} local rank {local}", flush=True)
    print(f"whoami-err: global rank {rank()}", file=sys.stderr, flush=True)
