"""An in-process rank watchdog over a hash-store side channel, for the watchdog tests.

The watchdog's `exit_fn` is replaced by one that records the code, so the test process survives
what would end a rank. The fixtures `watchdog_world` and `sigterm_pipe` (tests/conftest.py) use
these.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import torch.distributed as dist

from harness.rank.rankfiles import RecordKeeper
from harness.rank.sidechannel import SideChannel
from harness.rank.watchdog import WatchConfig, Watchdog
from harness.schema.rank_record import RankRecord

NODEID = "suites/x/test_y.py::test_z"


class Exits:
    def __init__(self) -> None:
        self.codes: list[int] = []
        self.done = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.done.set()


# What a watchdog needs around it: the out folder, both ranks' side channels, rank 0's keeper.
World = tuple[Path, list[SideChannel], RecordKeeper]


class CountingStore:
    """A c10d store that counts the operations made through it, by operation name."""

    def __init__(self, inner: dist.Store) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.checked: list[list[str]] = []  # the keys of every `check`, in order

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name == "check":
                self.checked.append(list(args[0]))
            return method(*args, **kwargs)

        return counted

    def total(self) -> int:
        return sum(self.calls.values())


def open_world(tmp_path: Path, store: Any = None) -> World:
    """Rank 0 of a two-rank world, its record started and one test collected."""
    store = dist.HashStore() if store is None else store
    chans = [SideChannel(store, r, 2, poll_s=0.005) for r in range(2)]
    keeper = RecordKeeper.start(
        tmp_path / "records",
        rank=0,
        world_size=2,
        local_rank=0,
        node_rank=0,
        backend="gloo",
        device="cpu",
        warm_impl="vendored",
    )
    keeper.collected((NODEID,))
    return tmp_path, chans, keeper


def make(
    world: World,
    *,
    wakeup_fd: int | None = None,
    agent_pid: int | None = None,
    **config: Any,
) -> tuple[Watchdog, Exits]:
    out, chans, keeper = world
    exits = Exits()
    dog = Watchdog(
        rank=0,
        world_size=2,
        channel=chans[0],
        keeper=keeper,
        out_dir=out,
        config=WatchConfig(**{"tick_s": 0.02, "exchange_grace_s": 0.5, **config}),
        wakeup_fd=wakeup_fd,
        exit_fn=exits,
        agent_pid=agent_pid,
    )
    dog.start()
    return dog, exits


class SigtermPipe:
    """The rank plugin's wakeup pipe: `read_fd` goes to the watchdog, `send()` plays torchrun."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()

    def send(self) -> None:
        os.write(self._write_fd, bytes([signal.SIGTERM]))

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self._write_fd)


def record(out: Path) -> RankRecord:
    return RankRecord.read(out / "records" / "rank-00.json")
