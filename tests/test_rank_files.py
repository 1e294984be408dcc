"""The rank record on disk: after every write it reads back as exactly the keeper's record
(the record's own `to_json` is the oracle), compact, and replaced whole; what only the live
progress reads (the running test, since when the rank waits) reaches it by the next heartbeat."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from harness.capture.events import LazyEvent
from harness.core.secrets import SCRUBBED
from harness.evidence.collect import in_progress
from harness.rank.rankfiles import RecordKeeper
from harness.schema.capture import CaptureRecord, DetectorStatus
from harness.schema.rank_record import RankRecord, TestOutcome

IDS = tuple(f"suites/x/test_y.py::test_{i}" for i in range(4))


def keeper(tmp_path: Path) -> RecordKeeper:
    return RecordKeeper.start(
        tmp_path / "records",
        rank=3,
        world_size=4,
        local_rank=3,
        node_rank=0,
        backend="gloo",
        device="cpu",
        warm_impl="vendored",
    )


def capture(test: str) -> CaptureRecord:
    return CaptureRecord(
        test=test,
        model="kimi-k3",
        rank=3,
        path="cpu-simulated",
        warm_impl="vendored",
        events=(LazyEvent("dynamo", 3, "compiled step", stack="x.py:1", phase="capture"),),
        detectors=(DetectorStatus(name="dynamo", active=True),),
    )


def on_disk(k: RecordKeeper) -> dict:
    text = k.path.read_text()
    assert "\n" not in text.rstrip("\n") and ": " not in text  # compact: one line, no spaces
    return json.loads(text)


def test_every_change_reads_back_as_the_record(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    assert on_disk(k) == k.record.to_json()
    k.collected(IDS)
    for i, nodeid in enumerate(IDS):
        k.running(nodeid)
        k.heartbeat()
        assert on_disk(k) == k.record.to_json() and on_disk(k)["current_test"] == nodeid
        k.add_capture(capture(nodeid))
        assert on_disk(k) == k.record.to_json()
        k.waiting()
        k.heartbeat()
        assert on_disk(k) == k.record.to_json() and on_disk(k)["waiting_since"] is not None
        k.add_test(TestOutcome(nodeid=nodeid, outcome="passed", duration_s=0.25 * i))
        assert on_disk(k) == k.record.to_json()
    k.update(extra={"transports": ["a"]})
    k.finish()
    final = RankRecord.read(k.path)
    assert final == k.record and final.complete and len(final.tests) == len(IDS)
    assert [c.test for c in final.captures] == list(IDS)


def test_a_record_that_does_not_extend_the_last_one_is_written_whole(tmp_path: Path) -> None:
    """The text reuses serialized items only for a record that keeps them: one that replaces
    its tests (or drops some) is serialized from scratch, never spliced from stale text."""
    k = keeper(tmp_path)
    k.collected(IDS)
    for nodeid in IDS[:3]:
        k.add_test(TestOutcome(nodeid=nodeid, outcome="passed"))
    rewritten = (TestOutcome(nodeid=IDS[3], outcome="failed", message="boom"),)
    k.update(tests=rewritten, collected=IDS[:1])
    assert on_disk(k) == k.record.to_json()
    assert [t["nodeid"] for t in on_disk(k)["tests"]] == [IDS[3]]
    k.update(tests=(*rewritten[:0], replace(rewritten[0], message="other")))
    assert on_disk(k)["tests"][0]["message"] == "other"


def test_a_killed_rank_s_last_write_names_its_test(tmp_path: Path) -> None:
    """What the endings rely on: a rank killed just after a test began leaves a whole record
    with every test before it, from which the evidence names the test it was in, and nothing
    but whole records in the folder."""
    k = keeper(tmp_path)
    k.collected(IDS)
    k.add_test(TestOutcome(nodeid=IDS[0], outcome="passed"))
    k.running(IDS[1])
    seen = RankRecord.read(k.path)
    assert [t.nodeid for t in seen.tests] == [IDS[0]] and not seen.complete
    assert in_progress(seen) == IDS[1]
    assert sorted(p.name for p in k.path.parent.iterdir()) == [k.path.name]


def test_the_running_test_and_the_wait_cost_no_write_until_the_heartbeat(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    k.collected(IDS)
    written = k.path.read_text()
    k.running(IDS[0])
    k.waiting()
    assert k.path.read_text() == written  # in memory only
    assert k.record.current_test == IDS[0] and k.record.waiting_since is not None
    k.heartbeat()
    assert on_disk(k)["current_test"] == IDS[0] and on_disk(k) == k.record.to_json()


def test_a_noted_change_travels_with_the_next_write(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    k.note(current_test=IDS[0])
    k.add_test(TestOutcome(nodeid=IDS[1], outcome="passed"))
    assert on_disk(k) == k.record.to_json() and on_disk(k)["current_test"] is None
    k.note(extra=replace(k.record.extra, transports=("t",)))
    k.finish()
    assert RankRecord.read(k.path).extra.transports == ("t",)


def test_a_heartbeat_with_nothing_noted_only_touches_the_record(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    written = k.path.read_text()
    before = k.path.stat().st_mtime_ns
    os.utime(k.path, ns=(before - 10**9, before - 10**9))
    k.heartbeat()
    assert k.path.read_text() == written and k.path.stat().st_mtime_ns > before - 10**9


def test_nothing_is_written_after_the_record_is_final(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    k.finish()
    final = k.path.read_text()
    k.running(IDS[0])
    k.heartbeat()
    assert k.path.read_text() == final and RankRecord.read(k.path).complete


SECRET_ID = "suites/x/test_y.py::test_login[hf_recordtoken0123456789abc]"


def test_a_secret_in_what_the_rank_records_never_reaches_the_disk_raw(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_recordtoken0123456789abc")
    k = keeper(tmp_path)
    k.collected((SECRET_ID,))
    k.running(SECRET_ID)
    k.add_test(
        TestOutcome(nodeid=SECRET_ID, outcome="failed", message="got hf_recordtoken0123456789abc")
    )
    k.heartbeat()
    text = k.path.read_text()
    assert "hf_recordtoken" not in text
    assert text.count(SCRUBBED) == 3  # the collected id, the test's id and its message
    assert k.record.tests[0].nodeid == SECRET_ID  # in memory the rank keeps what it ran


def test_without_the_secret_in_its_environment_the_same_record_holds_it(
    tmp_path: Path, monkeypatch
) -> None:
    """The control: the environment's secrets are what is scrubbed."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    k = keeper(tmp_path)
    k.collected((SECRET_ID,))
    assert "hf_recordtoken" in k.path.read_text()
