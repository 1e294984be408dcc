"""Find and end every process a launch started, including ranks torchrun left behind.

Why not just `killpg`: torchrun starts each rank in a new session (its own process group), so
killing torchrun's group misses them, and once torchrun is gone the ranks are re-parented and
no longer look like its children. The launcher therefore snapshots the tree while it is alive
(`Tracker.scan`) and can end anything from the snapshot later. A process is identified by
(pid, start time), so a recycled pid is never killed by mistake. Linux /proc only.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

PROC = Path("/proc")


class _HasPid(Protocol):
    @property
    def pid(self) -> int: ...


T = TypeVar("T", bound=_HasPid)


@dataclass(frozen=True)
class Proc:
    pid: int
    start_ticks: int


# The torchrun agents that launches in this process started (several at once when one process
# drives several nodes' launches). Each is a direct child of the launcher, as an orphan that
# re-parented to it would be: an adopting tracker must not take another launch's agent for one.
_LAUNCH_ROOTS: set[int] = set()
_LAUNCH_ROOTS_LOCK = threading.Lock()


def start_launch_root(start: Callable[[], T]) -> T:
    """Run `start` (which returns a started process with a `pid`) and remember that process as
    a launch root, atomically with respect to every tracker's scan in this process."""
    with _LAUNCH_ROOTS_LOCK:
        started = start()
        _LAUNCH_ROOTS.add(started.pid)
    return started


def end_launch_root(pid: int) -> None:
    with _LAUNCH_ROOTS_LOCK:
        _LAUNCH_ROOTS.discard(pid)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live, non-zombie process."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def identify(pid: int) -> Proc | None:
    stat = _stat(pid)
    return None if stat is None else Proc(pid, stat[1])


def alive(proc: Proc) -> bool:
    stat = _stat(proc.pid)
    return stat is not None and stat[1] == proc.start_ticks


def descendants(root: int) -> set[Proc]:
    """Every live process below `root` now (one pass over /proc)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is not None:
            children.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found: set[Proc] = set()
    todo = [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            found.add(Proc(pid, start))
            todo.append(pid)
    return found


def children_of(parent: int) -> set[Proc]:
    """The live processes whose parent is `parent` now."""
    found = set()
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[0] == parent:
                found.add(Proc(int(entry.name), stat[1]))
    return found


class Tracker:
    """Remembers every process ever seen under one root (the torchrun agent).

    With `adopter` (the launcher, a child subreaper), processes that re-parented to it and were
    not its children when tracking began are orphans of the run, and are tracked with their
    descendants too."""

    def __init__(self, root: int, adopter: int | None = None) -> None:
        self.root = root
        self.adopter = adopter
        self.seen: set[Proc] = set()
        self._before = set() if adopter is None else children_of(adopter)
        me = identify(root)
        if me is not None:
            self.seen.add(me)
            self._before.discard(me)

    def scan(self) -> None:
        self.seen |= descendants(self.root)
        if self.adopter is not None:
            with _LAUNCH_ROOTS_LOCK:
                others = _LAUNCH_ROOTS - {self.root}
                for orphan in children_of(self.adopter) - self._before:
                    if orphan.pid in others:
                        continue  # another launch's torchrun, not an orphan of this run
                    self.seen.add(orphan)
                    self.seen |= descendants(orphan.pid)

    def survivors(self) -> list[Proc]:
        return sorted((p for p in self.seen if alive(p)), key=lambda p: p.pid)

    def signal_all(self, sig: int) -> list[Proc]:
        """Send `sig` to every remembered process still alive; returns those signalled."""
        hit = []
        for proc in self.survivors():
            try:
                os.kill(proc.pid, sig)
                hit.append(proc)
            except (ProcessLookupError, PermissionError):
                continue
        return hit

    def end_all(self, grace_s: float, hurry: threading.Event | None = None) -> list[Proc]:
        """SIGTERM, wait up to `grace_s` (cut short once `hurry` is set), then SIGKILL what is
        left; returns the SIGKILLed."""
        self.scan()
        if not self.signal_all(signal.SIGTERM):
            return []
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.survivors():
            if hurry is not None and hurry.is_set():
                break
            time.sleep(0.1)
        self.scan()
        killed = self.signal_all(signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and self.survivors():
            time.sleep(0.05)
        return killed
