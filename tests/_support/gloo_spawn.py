"""Spawned 2-rank gloo jobs for tests that need a real process group (the pytest worker itself
never holds one): `spawn(fn)` runs `fn(rank, world, store)` on every rank, and `gloo_group`
joins and leaves the group around a rank's body."""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp


def spawn(fn: Callable[[int, int, str], None], world: int = 2) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(fn, args=(world, os.path.join(tmp, "store")), nprocs=world, join=True)


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
