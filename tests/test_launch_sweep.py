"""The launcher's last sweep: it keeps looking for the run's processes for a while after its
looks come back empty, so a process that a few looks in a row missed (a re-forking helper on a
loaded machine) is still found and ended."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

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
