"""The launcher's dead-rank watch: a rank is overdue only when its process is gone and the record
it left says it neither completed nor aborted, however the reads and its exit interleave."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness.launch import rankview
from harness.launch.ending import DEAD_RANK_GRACE_S, DeadRankWatch
from harness.launch.proctree import Tracker
from harness.launch.rankview import RecordReader
from harness.schema.rank_record import RankFacts, RankRecord, rank_record_path


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
    return DeadRankWatch(RecordReader(tmp_path, world_size=1), tracker)


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
        watch = DeadRankWatch(RecordReader(tmp_path, world_size=1), tracker)
        assert watch.overdue(now=0.0) == []
        assert watch.overdue(now=10 * DEAD_RANK_GRACE_S) == []
    finally:
        child.kill()
        child.wait()


def test_the_final_word_is_read_from_the_file_even_when_the_cache_looks_current(
    tmp_path: Path, gone: Tracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writes the stat identity cannot tell apart: the cached record still says running,
    the file says complete. The watch reads the file before it calls the rank gone."""
    path = rank_record_path(tmp_path, 0)
    running(gone).write(path)
    monkeypatch.setattr(rankview._Stamp, "of", classmethod(lambda cls, p: cls(0, 0, 0, 0, 0)))
    watch = watch_over(tmp_path, gone)
    assert watch.reader.statuses()[0].current_test is not None  # cached as running
    replace(running(gone), complete=True, current_test=None).write(path)
    assert not watch.reader.statuses()[0].finished, "the collision this test needs did not happen"
    assert watch.overdue(now=100.0) == []
    assert watch.overdue(now=100.0 + 10 * DEAD_RANK_GRACE_S) == []


def test_a_rank_the_tracker_has_not_seen_is_looked_for_as_soon_as_its_record_names_it(
    tmp_path: Path,
) -> None:
    tracker = Tracker(os.getpid())  # started before the rank: no scan has seen it
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = watch_over(tmp_path, tracker)
        record = RankRecord(rank=0, world_size=1, pid=child.pid, current_test="t.py::test_x")
        record.write(rank_record_path(tmp_path, 0))
        assert child.pid not in {p.pid for p in tracker.seen}
        assert watch.overdue(now=100.0) == []
        assert child.pid in {p.pid for p in tracker.seen}
    finally:
        child.kill()
        child.wait()
    assert watch.overdue(now=200.0) == []
    assert watch.overdue(now=200.0 + DEAD_RANK_GRACE_S) == [0]


def test_a_forked_rank_gone_before_any_scan_saw_it_is_overdue_where_it_is_this_nodes(
    tmp_path: Path,
) -> None:
    """Forked, a rank can start, write its record and exit between two scans (its forkserver
    reaps it, not the launcher): a record of this node naming a pid no process has is gone.
    One of another node (another host's pid) is never judged, nor any where the node is not
    known, and its peers would wait out the test timeout."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # gone before the tracker's first scan
    tracker = Tracker(os.getpid())
    # Its launcher's node 0, whatever group rank the rendezvous gave its node (here 1).
    facts = RankFacts(node_index=0)
    record = RankRecord(
        rank=0, world_size=1, pid=child.pid, node_rank=1, current_test="t.py::test_x", extra=facts
    )
    record.write(rank_record_path(tmp_path, 0))
    reader = RecordReader(tmp_path, world_size=1)
    for node, judged in ((None, []), (1, []), (0, [0])):
        watch = DeadRankWatch(reader, tracker, node)
        assert watch.overdue(now=100.0) == []
        assert watch.overdue(now=100.0 + DEAD_RANK_GRACE_S) == judged, node
