"""Sub-world cases through the real CLI on a 4-rank job: each case runs on its lane only, the
records say which ranks ran it and which did not, a failure in one lane is attributed to its
rank, and the whole world stops together after the block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.schema.rank_record import RankRecord

pytestmark = [pytest.mark.torchrun]

SUITE = Path(__file__).resolve().parent / "rank_suites" / "rank_subworld.py"


def test_lanes_run_side_by_side_and_stop_together(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DCPQUAL_FAULT_RANK", "3")
    out = tmp_path / "run"
    assert main(["run", "--nproc_per_node", "4", "--out", str(out), "--", str(SUITE)]) == 1
    records = {r: RankRecord.read(out / "records" / f"rank-{r:02d}.json") for r in range(4)}
    seen = {
        rank: {t.nodeid.rsplit("::", 1)[-1]: t for t in record.tests}
        for rank, record in records.items()
    }
    alone = [f"test_alone[{i}]" for i in range(3)]
    pairs = [f"test_in_pairs[{i}]" for i in range(3)]
    # The block first, in collection order within it; the whole-world test after it.
    assert [n.rsplit("::", 1)[-1] for n in records[0].collected] == [
        *alone,
        *pairs,
        "test_after_the_block",
    ]
    for rank in (0, 1):
        assert [seen[rank][n].outcome for n in alone] == ["passed"] * 3
        for name in pairs:  # not run here, and the line says where it ran
            line = seen[rank][name]
            assert line.outcome == "skipped"
            assert line.message and "ranks 2-3 (groups of 2)" in line.message, line.message
            assert line.elsewhere and line.ran_elsewhere
    for rank in (2, 3):
        assert [seen[rank][n].outcome for n in alone] == ["skipped"] * 3
        assert "ranks 0-1 (groups of 1)" in (seen[rank][alone[0]].message or "")
        assert seen[rank][pairs[0]].outcome == "passed"
        failed = seen[rank][pairs[1]]
        assert failed.outcome == "failed" and failed.failing_ranks == (3,)
        assert failed.primary == (rank == 3)
        assert pairs[2] not in seen[rank], "the lane stopped at its failure"
    for rank in range(4):  # everyone stopped after the block, at the same place
        assert "test_after_the_block" not in seen[rank]
        assert records[rank].complete
        assert records[rank].extra.subworld[0].lanes[1].ranks == (2, 3)
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["root_cause"]["rank"] == 3
    assert receipt["root_cause"]["test"].endswith(pairs[1])
    assert receipt["suites"]["rank_suites"]["failed"] == 1
    # a case another lane ran is no skip; the one its lane stopped before has no outcome
    coverage = receipt["coverage"]
    assert (coverage["skipped_everywhere"], coverage["skipped_on_some_ranks"]) == (0, 0)
    assert main(["verify", str(out)]) == 0
