"""`dcpqual run` as a pytest user meets it, through the real CLI on 2-rank torchrun jobs: the
ending and its rerun command, --maxfail in lockstep, --tee (rank logs by global rank from a
2 nodes x 2 ranks job: tests/test_run_torchrun.py, beside the other readers of that job)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from _support.runs import Launched

from harness.cli import main
from harness.evidence.rederive import rederive_problems
from harness.launch import launcher
from harness.launch.plan import RunOptions
from harness.schema.rank_record import RankRecord
from harness.schema.receipt import FailedTest, Receipt

pytestmark = [pytest.mark.torchrun]

SUITES = Path(__file__).resolve().parent / "rank_suites"
FAULT = "tests/rank_suites/rank_assert.py::test_fault"
TWO = "tests/rank_suites/rank_two_failures.py"


def receipt(out: Path) -> dict[str, Any]:
    return json.loads((out / "receipt.json").read_text())


def records(out: Path) -> dict[int, RankRecord]:
    found = (RankRecord.read(p) for p in sorted((out / "records").glob("rank-*.json")))
    return {rec.rank: rec for rec in found}


def ran(out: Path) -> dict[int, list[tuple[str, str]]]:
    """Per rank: (test name, outcome) of every test it recorded."""
    return {
        rank: [(t.nodeid.rsplit("::", 1)[-1], t.outcome) for t in rec.tests]
        for rank, rec in records(out).items()
    }


def test_a_failed_run_ends_like_pytest_and_its_printed_rerun_reruns_only_that_test(
    rank_assert_run: Launched, tmp_path: Path, monkeypatch
):
    out = rank_assert_run.out
    assert rank_assert_run.codes == (1,)
    lines = rank_assert_run.printed.splitlines()
    failed = f"FAILED {FAULT} - rank 1: AssertionError: injected assertion on rank 1"
    assert failed in lines
    assert any(
        re.fullmatch(r"=+ .*1 failed.*1 passed.* in [0-9.]+s \(FAIL\) =+", ln) for ln in lines
    )
    printed = lines[-1]
    assert printed == f"rerun the failed tests: dcpqual run --rerun-failed {out}"
    real = Receipt.model_validate_json((out / "receipt.json").read_text())
    assert rederive_problems(out, real) == []  # verify holds the list to the records
    other = FailedTest(nodeid="tests/rank_suites/rank_assert.py::test_before", outcome="failed")
    forged = real.model_copy(update={"failed_tests": [other]})
    assert any("failed_tests" in p for p in rederive_problems(out, forged))
    moved = real.model_copy(update={"run": real.run.model_copy(update={"rootdir": "/elsewhere"})})
    assert any("run.rootdir" in p for p in rederive_problems(out, moved))
    summary = (out / "summary.md").read_text()
    assert failed in summary.split("## Transport signatures")[0]
    assert printed in summary

    monkeypatch.chdir(tmp_path)  # run it as printed, from elsewhere, default --out
    command = shlex.split(printed.split(": ", 1)[1])
    assert command[:2] == ["dcpqual", "run"]
    assert main(command[1:]) == 1
    [again] = (tmp_path / "evidence").iterdir()
    assert {r: rec.collected for r, rec in records(again).items()} == {0: (FAULT,), 1: (FAULT,)}
    data = receipt(again)
    assert (data["geometry"]["world_size"], data["geometry"]["tp"]) == (2, 2)
    assert data["run"]["extra"]["options"]["rerun_of"] == str(out)
    assert data["run"]["extra"]["options"]["nproc_per_node"] == {"requested": "2", "resolved": 2}
    assert [t["nodeid"] for t in data["failed_tests"]] == [FAULT]
    assert main(["verify", str(again)]) == 0

    seen: list[RunOptions] = []
    monkeypatch.setattr(launcher, "run", lambda options, **kw: seen.append(options) or 0)
    assert main(["run", "--rerun-failed", str(out), "--dcp", "1", "--maxfail", "0"]) == 0
    [overridden] = seen
    assert (overridden.nproc_per_node, overridden.tp) == (2, 2)  # the bundle's
    assert (overridden.dcp, overridden.maxfail) == (1, 0)  # the flags'
    assert overridden.pytest_args == (str(SUITES / "rank_assert.py") + "::test_fault",)


def test_maxfail_2_goes_on_in_lockstep_and_tee_streams_only_the_chosen_rank(tmp_path: Path, capsys):
    out = tmp_path / "maxfail"
    argv = ["run", "--nproc-per-node", "2", "--tp", "2", "--maxfail", "2", "--tee", "1"]
    assert main([*argv, "--out", str(out), "--", "-s", str(SUITES / "rank_two_failures.py")]) == 1
    expected = [("test_first_fault", "failed"), ("test_in_between", "passed")]
    expected.append(("test_second_fault", "failed"))
    assert {r: [(n, o == "passed") for n, o in t] for r, t in ran(out).items()} == {
        r: [(n, o == "passed") for n, o in expected] for r in (0, 1)
    }
    assert all(rec.complete for rec in records(out).values())
    data = receipt(out)
    assert [(t["nodeid"].rsplit("::")[-1], t["ranks"]) for t in data["failed_tests"]] == [
        ("test_first_fault", [1]),
        ("test_second_fault", [1]),
    ]
    printed = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("[default1]:") for ln in printed)
    assert not any(ln.startswith("[default0]:") for ln in printed)
    assert sum(ln.startswith("FAILED ") for ln in printed) == 2
    agent_log = (out / "torchrun" / "node-00" / "agent.log").read_text()
    assert "[default1]:" in agent_log  # everything torchrun printed is still in its log


def test_by_default_every_rank_stops_at_the_first_failure(tmp_path: Path):
    out = tmp_path / "maxfail1"
    argv = ["run", "--nproc-per-node", "2", "--tp", "2", "--out", str(out)]
    assert main([*argv, "--", str(SUITES / "rank_two_failures.py")]) == 1
    assert {r: [n for n, _ in t] for r, t in ran(out).items()} == {
        0: ["test_first_fault"],
        1: ["test_first_fault"],
    }


def test_progress_names_the_rank_the_others_wait_for_and_an_eta(tmp_path: Path, capsys):
    out = tmp_path / "slow"
    argv = ["run", "--nproc-per-node", "2", "--tp", "2", "--out", str(out)]
    assert main([*argv, "--", str(SUITES / "rank_slow.py")]) == 0
    progress = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("dcpqual run [")]
    assert any("on rank(s) 1" in ln and "rank_slow.py::test_slow" in ln for ln in progress)
    assert not any("on rank(s) 0" in ln for ln in progress)
    assert any(re.search(r"tests 1/3 .*ETA \d+s", ln) for ln in progress)
