"""The pytest worker's multiprocessing forkserver: children forked from one interpreter that
imported torch and the harness's command line once, instead of each importing them itself
(about 1.5 CPU-seconds for torch, 0.25 for the command line, on two cores).

multiprocessing keeps one server per process and reads the preload list when it starts it, so
every user (the gloo jobs of `gloo_spawn`, the commands of `forked_cli`) asks for it through
`context()`, with one list, whichever starts it first. The pytest worker is threaded: it never
forks itself."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import ForkServerContext

from harness.cli import COMMAND_MODULES

PRELOAD = [
    "torch",
    "torch.distributed",
    "harness.cli",
    *COMMAND_MODULES,
    "harness.launch.launcher",
]


def context() -> ForkServerContext:
    """multiprocessing's forkserver context, its preload list set before the server starts."""
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(PRELOAD)
    return forkserver
