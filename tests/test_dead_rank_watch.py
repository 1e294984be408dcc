"""The launcher's dead-rank watch: a rank is overdue only when its process is gone and the record
it left says it neither completed nor aborted, however the reads and its exit interleave."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness.launch.ending import DEAD_RANK_GRACE_S, DeadRankWatch
from harness.launch.proctree import Tracker
from harness.schema.rank_record import RankRecord, rank_record_path


@pytest.fixture
def gone() -> Tracker:
    """A tracker that saw its one process (the rank) and the rank has since exited."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    tracker = Tracker(child.pid)
    child.kill()
    child.wait()
    return tracker


def rank_pid(tracker: Tracker) -> int:
    return next(iter(tracker.seen)).pid


def watch_over(tmp_path: Path, tracker: Tracker) -> DeadRankWatch:
    return DeadRankWatch(tmp_path, world_size=1, tracker=tracker)


def running(tracker: Tracker) -> RankRecord:
    pid = rank_pid(tracker)
    return RankRecord(rank=0, world_size=1, pid=pid, current_test="suites/t.py::test_x")


def test_a_rank_gone_with_an_unfinished_record_is_overdue_after_the_grace(
    tmp_path: Path, gone: Tracker
) -> None:
    running(gone).write(rank_record_path(tmp_path, 0))
    watch = watch_over(tmp_path, gone)
    assert watch.overdue(now=100.0) == []
    assert watch.overdue(now=100.0 + DEAD_RANK_GRACE_S) == [0]


def test_a_rank_that_completes_and_exits_between_the_read_and_the_check_is_not_overdue(
    tmp_path: Path, gone: Tracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = rank_record_path(tmp_path, 0)
    running(gone).write(path)
    watch = watch_over(tmp_path, gone)
    read_all = watch._records

    def read_then_the_rank_finishes() -> dict[int, RankRecord]:
        seen = read_all()  # the record as it was while the rank still ran its last test
        replace(running(gone), complete=True, current_test=None).write(path)
        return seen

    monkeypatch.setattr(watch, "_records", read_then_the_rank_finishes)
    assert watch.overdue(now=100.0) == []
    monkeypatch.setattr(watch, "_records", read_all)
    assert watch.overdue(now=100.0 + 10 * DEAD_RANK_GRACE_S) == []


def test_a_rank_first_seen_gone_then_read_complete_is_forgotten(
    tmp_path: Path, gone: Tracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = rank_record_path(tmp_path, 0)
    running(gone).write(path)
    watch = watch_over(tmp_path, gone)
    assert watch.overdue(now=100.0) == []
    replace(running(gone), complete=True, current_test=None).write(path)
    assert watch.overdue(now=100.0 + DEAD_RANK_GRACE_S) == []


def test_a_live_rank_is_never_overdue(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tracker = Tracker(child.pid)
        running(tracker).write(rank_record_path(tmp_path, 0))
        watch = watch_over(tmp_path, tracker)
        assert watch.overdue(now=0.0) == []
        assert watch.overdue(now=10 * DEAD_RANK_GRACE_S) == []
    finally:
        child.kill()
        child.wait()
