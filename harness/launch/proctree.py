"""Find and end every process a launch started, including ranks torchrun left behind.

Why not just `killpg`: torchrun starts each rank in a new session (its own process group), so
killing torchrun's group misses them, and once torchrun is gone the ranks are re-parented and
no longer look like its children. The launcher therefore snapshots the tree while it is alive
(`Tracker.scan`) and can end anything from the snapshot later. A process is identified by
(pid, create time), so a recycled pid is never killed by mistake; a zombie counts as gone.

The tree is read through psutil. Waiting is a poll of the identities, never `psutil.wait_procs`:
that reaps the launcher's own children, and torchrun's exit status belongs to its `Popen`.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import psutil

from harness.pidfd import pidfd_open

_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


class _HasPid(Protocol):
    @property
    def pid(self) -> int: ...


T = TypeVar("T", bound=_HasPid)


@dataclass(frozen=True)
class Proc:
    """One process: its pid and psutil's create time (seconds since the epoch)."""

    pid: int
    create_time: float


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


def _identity(process: psutil.Process) -> Proc | None:
    """The identity of a live, non-zombie process; None once it is gone (or unreadable)."""
    try:
        with process.oneshot():
            if process.status() in _GONE:
                return None
            return Proc(process.pid, process.create_time())
    except psutil.Error:  # NoSuchProcess, ZombieProcess, AccessDenied
        return None


def _identities(processes: Iterable[psutil.Process]) -> set[Proc]:
    return {proc for process in processes if (proc := _identity(process)) is not None}


def identify(pid: int) -> Proc | None:
    try:
        return _identity(psutil.Process(pid))
    except psutil.Error:
        return None


def alive(proc: Proc) -> bool:
    return identify(proc.pid) == proc


def named(proc: Proc, name: str) -> bool:
    """`proc` is alive and its process name (/proc comm) is `name`."""
    try:
        process = psutil.Process(proc.pid)
        return process.create_time() == proc.create_time and process.name() == name
    except psutil.Error:
        return False


def descendants(root: int) -> set[Proc]:
    """Every live process below `root` now."""
    try:
        return _identities(psutil.Process(root).children(recursive=True))
    except psutil.Error:  # root gone: its children re-parented, none is below it any more
        return set()


def children_of(parent: int) -> set[Proc]:
    """The live processes whose parent is `parent` now."""
    try:
        return _identities(psutil.Process(parent).children())
    except psutil.Error:
        return set()


class ExitWait:
    """Waits for a child process to exit without polling for it: Linux's pidfd becomes readable
    when the process exits (one wakeup, no CPU meanwhile); where there is none, `Popen.wait`
    polls as it always does. Either way the exit status is collected by the child's `Popen`."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self._poll: select.poll | None = None
        self._fd = pidfd_open(proc.pid)
        if self._fd is None:
            return
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)

    def wait(self, timeout_s: float) -> bool:
        """True once the process has exited (its returncode set), after at most `timeout_s`."""
        if self._poll is not None and not self._poll.poll(timeout_s * 1000):
            return False
        if self._poll is not None and self.proc.poll() is not None:
            return True
        try:  # no pidfd (or it woke without the exit status ready): Popen's own wait
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = self._poll = None


class Tracker:
    """Remembers every process ever seen under one root (the torchrun agent, whose forkserver
    and its ranks are its descendants).

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
                    if orphan.pid == self.root:
                        continue  # the root itself, whose tree was just read
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
        self.wait_gone(grace_s, poll_s=0.1, hurry=hurry)
        self.scan()
        killed = self.signal_all(signal.SIGKILL)
        self.wait_gone(5.0, poll_s=0.05)
        return killed

    def wait_gone(
        self, timeout_s: float, *, poll_s: float, hurry: threading.Event | None = None
    ) -> bool:
        """Wait until no remembered process is alive, at most `timeout_s` (less once `hurry`
        is set); True when none is."""
        deadline = time.monotonic() + timeout_s
        while self.survivors():
            if time.monotonic() >= deadline or (hurry is not None and hurry.is_set()):
                return False
            time.sleep(poll_s)
        return True
