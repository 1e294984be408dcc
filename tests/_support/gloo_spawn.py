"""2-rank gloo jobs for tests that need a real process group (the pytest worker itself never
holds one): `spawn(fn)` runs `fn(rank, world, store)` on every rank, and `gloo_group` joins and
leaves the group around a rank's body.

The ranks are children of the pytest worker's forkserver (`_support.forkserver`), which imports
torch once: a spawned child would import torch itself, about 1.5 CPU-seconds a rank on two cores.
Each child still imports the test module `fn` lives in, as a spawned one does."""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp

from _support import forkserver


def spawn(fn: Callable[[int, int, str], None], world: int = 2) -> None:
    forkserver.context()  # its preload list, before the server starts
    with tempfile.TemporaryDirectory() as tmp:
        args = (world, os.path.join(tmp, "store"))
        mp.start_processes(fn, args=args, nprocs=world, join=True, start_method="forkserver")


@contextmanager
def gloo_group(rank: int, world: int, store: str) -> Iterator[None]:
    """The default process group over a file store, destroyed on the way out. Cyclic garbage
    (exception tracebacks holding the group) is freed first: a gloo group object that outlives
    `destroy_process_group` aborts the process at exit."""
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        yield
    finally:
        gc.collect()
        dist.destroy_process_group()
