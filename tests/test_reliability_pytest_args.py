"""pytest arguments that take away what the rank plugin builds on: a real `dcpqual run` at 2
ranks with pytest's junitxml disabled ends with an honest bundle, not a dead rank."""

from __future__ import annotations

from pathlib import Path

import pytest
from _support.runs import SUITES, receipt

from harness.cli import main
from harness.schema.rank_record import RankRecord, rank_record_path

pytestmark = [pytest.mark.torchrun]


def test_without_junitxml_the_ranks_finish_and_the_bundle_says_what_is_missing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "bundle"
    argv = ["run", "--nproc-per-node", "2", "--tp", "2", "--out", str(out)]
    code = main([*argv, "--", "-p", "no:junitxml", str(SUITES / "rank_pass.py")])
    data = receipt(out)
    assert data["ranks"]["complete"] == 2 and data["ranks"]["killed"] == []
    assert data["ranks"]["missing_junit"] == [0, 1]
    assert (code, data["verdict"]) == (0, "pass"), data["failures"]
    assert data["status"] == "source-qualified"
    ranks = {i["key"]: i["text"] for i in data["limitation_items"]}["ranks"]
    assert "left no readable JUnit report" in ranks
    # each rank says so itself, so a report made up later is not taken for its own
    said = [RankRecord.read(rank_record_path(out / "records", r)).extra.junit for r in (0, 1)]
    assert said == [False, False]
    assert main(["verify", str(out)]) == 0
