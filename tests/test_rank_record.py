"""The rank record's geometry and selection: written by new ranks, absent from old records."""

from __future__ import annotations

from pathlib import Path

from harness.schema.rank_record import RankRecord, Selection


def test_geometry_and_selection_round_trip() -> None:
    selection = Selection(
        targets=("suites/capture",), partial_targets=("suites/capture",), deselected=2
    )
    record = RankRecord(rank=1, world_size=4, tp=16, dcp=4, selection=selection)
    again = RankRecord.from_json(record.to_json())
    assert (again.tp, again.dcp, again.selection) == (16, 4, selection)


def test_a_record_written_before_them_reads_as_not_recorded() -> None:
    old = RankRecord(rank=0, world_size=2).to_json()
    for key in ("tp", "dcp", "selection"):
        del old[key]
    record = RankRecord.from_json(old)
    assert (record.tp, record.dcp, record.selection) == (None, None, None)


def test_only_the_whole_suites_folder_is_a_whole_target(tmp_path: Path) -> None:
    suites = tmp_path / "suites"
    (suites / "capture").mkdir(parents=True)
    given = [str(suites), "suites", "suites/", "suites/capture", "suites/capture/t.py::test_x"]
    selection = Selection.of(given, invocation_dir=tmp_path, suites=suites)
    assert selection.partial_targets == ("suites/capture", "suites/capture/t.py::test_x")
    assert (
        Selection.of([str(suites)], invocation_dir=Path("/"), suites=suites).partial_targets == ()
    )
