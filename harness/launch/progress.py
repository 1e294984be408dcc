"""Progress for the person watching `dcpqual run`: tests done / total, ranks alive, elapsed,
an ETA from the collected count, and which ranks hold a test up while the others wait for them.

The ranks already keep `records/rank-NN.json` current after every test, so the launcher only
polls those files, through the `RecordReader` it shares with the dead-rank watch (a file is
parsed again only when it changed); nothing extra travels between processes. On a terminal the
line is a rich live display; when stdout is not a terminal, or CI=true, plain lines are printed,
one per change of the counts and at least every `heartbeat_s`, so CI logs stay short and
greppable.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TextIO

from harness.launch.rankview import RecordReader


@dataclass(frozen=True)
class Snapshot:
    """What the ranks have reported so far. `done` counts tests every reporting rank finished."""

    elapsed_s: float
    world_size: int
    reported: int = 0
    alive: int = 0
    done: int = 0
    total: int = 0
    failed: int = 0
    current: str | None = None
    # Ranks still running `current` while others already wait for them, and how long the
    # first has waited: who holds the test up.
    behind: tuple[int, ...] = ()
    waited_s: float = 0.0

    @property
    def eta_s(self) -> float | None:
        """Time left at the pace so far (elapsed per finished test x tests left)."""
        if not self.done or not self.total or self.done >= self.total:
            return None
        return self.elapsed_s / self.done * (self.total - self.done)

    def line(self) -> str:
        total = str(self.total) if self.total else "?"
        parts = [
            f"[{self.elapsed_s:6.1f}s]",
            f"tests {self.done}/{total}",
            f"ranks alive {self.alive}/{self.world_size}",
        ]
        if self.eta_s is not None:
            parts.append(f"ETA {self.eta_s:.0f}s")
        if self.failed:
            parts.append(f"FAILED {self.failed}")
        if self.current:
            parts.append(f"running {self.current}")
        if self.behind:
            shown = ", ".join(map(str, self.behind[:8])) + (", ..." if len(self.behind) > 8 else "")
            parts.append(f"waiting {self.waited_s:.0f}s on rank(s) {shown}")
        return "  ".join(parts)


def snapshot(reader: RecordReader, elapsed_s: float, *, fresh: bool = False) -> Snapshot:
    """What the records say now; unreadable or missing ones count as not reported. `fresh`:
    every file read again (the last word, once torchrun has exited)."""
    records = list(reader.statuses(fresh=fresh).values())
    world_size = reader.world_size
    if not records:
        return Snapshot(elapsed_s=elapsed_s, world_size=world_size)
    alive = sum(1 for r in records if not r.finished)
    failed = len({t.nodeid for r in records for t in r.tests if t.outcome in ("failed", "error")})
    running = [r.current_test for r in records if r.current_test]
    behind, waited = slowest(records, time.time())
    return Snapshot(
        elapsed_s=elapsed_s,
        world_size=world_size,
        reported=len(records),
        alive=alive,
        done=min(len(r.tests) for r in records),
        total=max(len(r.collected) for r in records),
        failed=failed,
        current=_short_id(running[0]) if running else None,
        behind=behind,
        waited_s=waited,
    )


def _short_id(nodeid: str) -> str:
    """The test id without its file's folders; a '/' in its parameters stays (it is part of
    what the console's scrub must see whole)."""
    path, sep, rest = nodeid.partition("::")
    return path.rsplit("/", 1)[-1] + sep + rest


class _AtTest(Protocol):
    """What `slowest` reads of a rank: a `RankStatus`, or a whole `RankRecord`."""

    @property
    def rank(self) -> int: ...

    @property
    def current_test(self) -> str | None: ...

    @property
    def waiting_since(self) -> float | None: ...

    @property
    def abort_reason(self) -> str | None: ...


def slowest(records: Sequence[_AtTest], now: float) -> tuple[tuple[int, ...], float]:
    """Ranks still in the body of a test that other ranks finished and wait on, and the
    longest wait so far. Empty while nobody waits (every rank still runs, or between tests)."""
    for test in dict.fromkeys(r.current_test for r in records if r.current_test):
        at = [r for r in records if r.current_test == test and r.abort_reason is None]
        waiting = [r.waiting_since for r in at if r.waiting_since is not None]
        running = tuple(sorted(r.rank for r in at if r.waiting_since is None))
        if waiting and running:
            return running, max(0.0, now - min(waiting))
    return (), 0.0


class Progress(Protocol):
    def update(self, snap: Snapshot) -> None: ...

    def close(self, snap: Snapshot | None = None) -> None: ...


class PlainProgress:
    """One line per change (tests done, ranks alive, failures), plus a periodic heartbeat."""

    def __init__(self, stream: TextIO, heartbeat_s: float = 30.0) -> None:
        self.stream = stream
        self.heartbeat_s = heartbeat_s
        self._last_key: tuple[object, ...] | None = None
        self._last_time = 0.0

    def update(self, snap: Snapshot) -> None:
        key = (snap.done, snap.total, snap.alive, snap.failed, snap.behind)
        now = time.monotonic()
        if key != self._last_key or now - self._last_time >= self.heartbeat_s:
            self.stream.write(f"dcpqual run {snap.line()}\n")
            self.stream.flush()
            self._last_key, self._last_time = key, now

    def close(self, snap: Snapshot | None = None) -> None:
        if snap is not None:
            self._last_key = None
            self.update(snap)


class RichProgress:
    """A single live line, redrawn in place (rich), for people at a terminal."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=stream)
        self._live = Live("", console=self._console, refresh_per_second=4, transient=False)
        self._live.start()

    def update(self, snap: Snapshot) -> None:
        from rich.text import Text

        # Text, not a str: a str is read as markup, and a test id's `[kimi-k3]` would vanish.
        self._live.update(Text(f"dcpqual run {snap.line()}"))

    def close(self, snap: Snapshot | None = None) -> None:
        if snap is not None:
            self.update(snap)
        self._live.stop()


def wants_plain(stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    is_tty = getattr(stream, "isatty", lambda: False)()
    return (not is_tty) or env.get("CI", "").lower() in ("1", "true", "yes")


def make_progress(stream: TextIO | None = None, *, plain: bool = False) -> Progress:
    """`plain`: plain lines even on a terminal (tee'd rank output would tear a live line)."""
    stream = sys.stdout if stream is None else stream
    return PlainProgress(stream) if plain or wants_plain(stream) else RichProgress(stream)


def poller(reader: RecordReader, progress: Progress) -> Callable[[float], None]:
    """The launcher's per-tick callback: read the records that changed, show the counts."""

    def poll(elapsed_s: float) -> None:
        progress.update(snapshot(reader, elapsed_s))

    return poll
