"""The launcher's last sweep: it keeps looking for the run's processes for a while after its
looks come back empty, so a process that a few looks in a row missed (a re-forking helper on a
loaded machine) is still found and ended; and it ends what it finds with its process group, so
an incarnation no look saw dies with the one a look found."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support.runs import wait_until

from harness.launch import ending
from harness.launch.proctree import Proc, alive, identify


class LateTracker:
    """A tracker whose looks see the helper only from the `shows_at`-th look on, as when the
    first looks read /proc after the incarnation they listed had exited."""

    def __init__(self, helper: Proc, shows_at: int) -> None:
        self.helper = helper
        self.shows_at = shows_at
        self.looks = 0
        self.seen: set[Proc] = set()

    def scan(self) -> None:
        self.looks += 1
        if self.looks >= self.shows_at:
            self.seen.add(self.helper)

    def survivors(self) -> list[Proc]:
        return sorted((p for p in self.seen if alive(p)), key=lambda p: p.pid)


@pytest.fixture
def helper() -> Iterator[Proc]:
    proc = subprocess.Popen(["sleep", "60"])
    found = identify(proc.pid)
    assert found is not None
    yield found
    proc.kill()
    proc.wait()


def test_a_process_the_first_looks_missed_is_still_found_and_ended(helper: Proc) -> None:
    tracker = LateTracker(helper, shows_at=8)
    started = time.monotonic()
    ended = ending.sweep(tracker, None, quiet_scans=3, quiet_s=0.5)  # type: ignore[arg-type]
    assert ended == {helper}
    assert not alive(helper)
    assert tracker.looks > 8 and time.monotonic() - started >= 0.5


def test_three_empty_looks_alone_would_have_missed_it(helper: Proc) -> None:
    """The negative control: without the quiet window the sweep stops after three looks."""
    tracker = LateTracker(helper, shows_at=8)
    assert ending.sweep(tracker, None, quiet_scans=3, quiet_s=0.0) == set()  # type: ignore[arg-type]
    assert tracker.looks == 3 and alive(helper)


def test_the_witness_reads_the_newest_processes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[int] = []

    class Entry:
        def __init__(self, pid: int) -> None:
            self.name = str(pid)

        def __truediv__(self, part: str) -> Entry:
            read.append(int(self.name))
            raise OSError("gone")

    monkeypatch.setattr(ending, "_proc_entries", lambda: [Entry(p) for p in (7, 300, 42)])
    assert ending.EnvironmentWitness("DCPQUAL_PLAN=x").find() == set()
    assert read == [300, 42, 7]


class FixedTracker(LateTracker):
    """A tracker whose every look sees the helper and nothing else."""

    def __init__(self, helper: Proc) -> None:
        super().__init__(helper, shows_at=1)


PARENT_AND_CHILD = (
    "import os, sys, time\n"
    "pid = os.fork()\n"
    "if pid:\n"
    "    open(sys.argv[1] + '.tmp', 'w').write(str(pid))\n"
    "    os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def parent_and_child(tmp_path: Path) -> Iterator[tuple[Proc, Proc]]:
    """A helper in a process group of its own and its child, which no look will see."""
    noted = tmp_path / "child.pid"
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT_AND_CHILD, str(noted)], start_new_session=True
    )
    deadline = time.monotonic() + 30
    while not noted.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    parent, child = identify(proc.pid), identify(int(noted.read_text()))
    assert parent is not None and child is not None
    yield parent, child
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_what_the_sweep_finds_dies_with_its_whole_process_group(parent_and_child) -> None:
    parent, child = parent_and_child
    assert ending.sweep(FixedTracker(parent), None, quiet_s=0.1) == {parent}  # type: ignore[arg-type]
    assert wait_until(lambda: not alive(child), 5), "the unseen child outlived the sweep"


def test_a_kill_of_the_found_pid_alone_would_leave_the_unseen_child(
    parent_and_child, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: without the group kill, the child no look saw lives on."""
    parent, child = parent_and_child
    monkeypatch.setattr(ending.os, "killpg", lambda group, sig: None)
    ending.sweep(FixedTracker(parent), None, quiet_s=0.1)  # type: ignore[arg-type]
    assert not wait_until(lambda: not alive(child), 1)


class GoneBeforeItsKillTracker(LateTracker):
    """A tracker whose every look sees the helper, which has always exited again by the time
    the sweep asks what is still alive: a re-forking helper's incarnations on a loaded
    machine, each leaving its child in its process group."""

    def __init__(self, helper: Proc) -> None:
        super().__init__(helper, shows_at=1)

    def survivors(self) -> list[Proc]:
        return []


def test_the_group_of_a_process_a_look_saw_is_ended_though_it_was_gone_before_its_kill(
    parent_and_child,
) -> None:
    parent, child = parent_and_child
    ending.sweep(GoneBeforeItsKillTracker(parent), None, quiet_s=0.1)  # type: ignore[arg-type]
    assert wait_until(lambda: not alive(child), 5), "the unseen child outlived the sweep"


def test_without_the_groups_read_at_each_look_the_child_lives_on(
    parent_and_child, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: with the group not read as the look returns, the sweep finds
    nothing alive to kill, and the child lives on."""
    parent, child = parent_and_child
    monkeypatch.setattr(ending, "process_group", lambda pid: None)
    ending.sweep(GoneBeforeItsKillTracker(parent), None, quiet_s=0.1)  # type: ignore[arg-type]
    assert not wait_until(lambda: not alive(child), 1)
