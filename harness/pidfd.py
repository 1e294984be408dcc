"""A descriptor that becomes readable when a process exits (Linux's pidfd).

One wait-without-polling for the launcher (torchrun's exit) and the rank's watchdog (the
agent's exit). It lives at the top of `harness` because the rank side imports no launch module.
"""

from __future__ import annotations

import os


def pidfd_open(pid: int) -> int | None:
    """A pidfd of `pid`, or None where there is none: not Linux >= 5.3, or `pid` already gone.

    The caller closes it; without one it has to fall back to polling the process."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
