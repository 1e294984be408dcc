"""An error outcome (a fixture's setup or teardown raising) on one rank fails the agreed
outcome of that test on every rank, and the run, through the real CLI at 2 ranks: a pass on
the other rank must not outvote it."""

from __future__ import annotations

from pathlib import Path

import pytest
from _support.runs import receipt, records, run

pytestmark = [pytest.mark.torchrun]

SUITE = "rank_fixture_error.py"
NODE = f"tests/rank_suites/{SUITE}::"


def test_a_fixture_error_on_one_rank_fails_the_test_on_every_rank(tmp_path: Path) -> None:
    out = tmp_path / "errors"
    code, _ = run(out, 2, SUITE, "--maxfail", "0")
    assert code == 1
    data = receipt(out)
    assert data["verdict"] == "fail"
    failed = {t["nodeid"]: t for t in data["failed_tests"]}
    assert set(failed) == {NODE + "test_setup_error", NODE + "test_teardown_error"}
    assert all(t["ranks"] == [1] for t in failed.values()), failed
    assert "injected setup error on rank 1" in failed[NODE + "test_setup_error"]["message"]
    assert "injected teardown error on rank 1" in failed[NODE + "test_teardown_error"]["message"]
    for rank, record in records(out).items():
        outcomes = {t.nodeid.rsplit("::", 1)[-1]: (t.outcome, t.primary) for t in record.tests}
        assert outcomes["test_before"][0] == outcomes["test_after"][0] == "passed", rank
        for name in ("test_setup_error", "test_teardown_error"):
            assert outcomes[name] == ("error", rank == 1), (rank, name, outcomes)
