"""The synthetic out folders of `_support.evidence_factory` look like what the launcher leaves."""

from __future__ import annotations

from pathlib import Path

from _support.evidence_factory import passing_run

from harness.schema.rank_record import RankRecord


def test_factory_runs_write_what_the_launcher_would(tmp_path: Path) -> None:
    ctx = passing_run(tmp_path, world=2)
    assert ctx.world_size == 2
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == [
        "rank-00.json",
        "rank-01.json",
    ]
    assert RankRecord.read(tmp_path / "records" / "rank-01.json").complete
