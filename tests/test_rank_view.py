"""The launcher's live view of the rank records: what it reads is what the full record says (the
strict `RankRecord.read` is the oracle), a file is parsed again only when it changed, and a file
that is no rank record reads as none, without hanging on a FIFO."""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path

import pytest

from harness.launch.rankview import (
    FactsStatus,
    RankStatus,
    RecordReader,
    StartStatus,
    TestStatus,
    read_status,
)
from harness.rank.rankfiles import RecordKeeper
from harness.schema.rank_record import (
    RankFacts,
    RankRecord,
    RankStart,
    TestOutcome,
    rank_record_path,
)

IDS = tuple(f"suites/x/test_y.py::test_{i}" for i in range(3))


def keeper(records: Path, rank: int = 1) -> RecordKeeper:
    return RecordKeeper.start(
        records,
        rank=rank,
        world_size=2,
        local_rank=rank,
        node_rank=0,
        backend="gloo",
        device="cpu",
        warm_impl="vendored",
    )


def as_full_record_says(path: Path) -> dict[str, object]:
    """The view's fields, taken from the whole record as the evidence reads it."""
    record = RankRecord.read(path)
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(RankStatus)}
    fields["tests"] = tuple((t.nodeid, t.outcome) for t in record.tests)
    fields["start"] = None if record.start is None else record.start.output_relay
    fields["extra"] = record.extra.node_index
    return fields


def as_viewed(status: RankStatus) -> dict[str, object]:
    fields = {f.name: getattr(status, f.name) for f in dataclasses.fields(RankStatus)}
    fields["tests"] = tuple((t.nodeid, t.outcome) for t in status.tests)
    fields["start"] = None if status.start is None else status.start.output_relay
    fields["extra"] = status.extra.node_index
    return fields


def test_the_view_has_the_records_own_field_names_and_types() -> None:
    record = typing.get_type_hints(RankRecord)
    view = typing.get_type_hints(RankStatus)
    nested = ("tests", "start", "extra")
    assert {k: v for k, v in view.items() if k not in nested} == {
        k: record[k] for k in view if k not in nested
    }
    outcome = typing.get_type_hints(TestOutcome)
    assert typing.get_type_hints(TestStatus) == {k: outcome[k] for k in ("nodeid", "outcome")}
    start = typing.get_type_hints(RankStart)
    assert typing.get_type_hints(StartStatus) == {"output_relay": start["output_relay"]}
    facts = typing.get_type_hints(RankFacts)
    assert typing.get_type_hints(FactsStatus) == {"node_index": facts["node_index"]}


def test_every_write_of_a_rank_reads_as_the_full_record_says(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    reader = RecordReader(tmp_path, world_size=2)
    k.collected(IDS)
    for i, nodeid in enumerate(IDS):
        k.running(nodeid)
        k.heartbeat()
        assert as_viewed(reader.statuses()[1]) == as_full_record_says(k.path)
        k.waiting()
        k.heartbeat()
        assert as_viewed(reader.statuses()[1]) == as_full_record_says(k.path)
        k.add_test(TestOutcome(nodeid, "failed" if i == 1 else "passed"))
        assert as_viewed(reader.statuses()[1]) == as_full_record_says(k.path)
    k.finish()
    final = reader.statuses()[1]
    assert final.complete and final.finished and len(final.tests) == len(IDS)
    assert as_viewed(final) == as_full_record_says(k.path)


def test_an_indented_record_reads_the_same(tmp_path: Path) -> None:
    path = rank_record_path(tmp_path, 0)
    RankRecord(
        rank=0, world_size=1, pid=7, abort_reason="stopped", waiting_since=1.5, collected=IDS
    ).write(path)
    assert as_viewed(read_status(path)) == as_full_record_says(path)
    assert read_status(path).finished


def test_a_file_is_parsed_again_only_when_it_changed(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    reader = RecordReader(tmp_path, world_size=2)
    assert set(reader.statuses()) == {1} and reader.parsed == 1
    for _ in range(5):
        reader.statuses()
    assert reader.parsed == 1, "an unchanged file was parsed again"
    k.collected(IDS)
    assert reader.statuses()[1].collected == IDS and reader.parsed == 2
    assert reader.status(1, fresh=True) is not None and reader.parsed == 3
    k.path.unlink()
    assert reader.statuses() == {}


def test_what_is_no_rank_record_reads_as_none_and_a_fifo_does_not_hang(tmp_path: Path) -> None:
    good = RankRecord(rank=0, world_size=5)
    bad = {
        1: "not json",
        2: json.dumps({**good.to_json(), "schema": "dcpqual-receipt/v1"}),
        3: json.dumps({**good.to_json(), "waiting_since": None, "pid": -1}),
        4: '{"rank": 4, "schema": "dcpqual-rank-record/v1", "x": ' + "[" * 300 + "]" * 300 + "}",
    }
    good.write(rank_record_path(tmp_path, 0))
    for rank, text in bad.items():
        rank_record_path(tmp_path, rank).write_text(text)
    reader = RecordReader(tmp_path, world_size=6)
    os.mkfifo(rank_record_path(tmp_path, 5))
    assert set(reader.statuses()) == {0}
    assert reader.statuses(fresh=True)[0] == read_status(rank_record_path(tmp_path, 0))


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_a_non_finite_wait_is_no_status(tmp_path: Path, value: str) -> None:
    path = rank_record_path(tmp_path, 0)
    text = json.dumps(RankRecord(rank=0, world_size=1, waiting_since=1.0).to_json())
    path.write_text(text.replace('"waiting_since": 1.0', f'"waiting_since": {value}'))
    with pytest.raises(ValueError):
        read_status(path)
