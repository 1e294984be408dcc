"""What `dcpqual run` tells its reader, from one 2-rank torchrun job of a small suite: skips by
reason, every failing rank named, what --maxfail left unrun, the failure text once, and a
summary.md whose first screen says what was qualified, at what scope."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from _support import forked_cli

pytestmark = [pytest.mark.torchrun, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
SUITE = "tests/rank_suites/rank_report.py"
FAILING = f"{SUITE}::test_every_rank_fails_alike"


@dataclass(frozen=True)
class Run:
    out: Path
    code: int
    stdout: str
    stderr: str

    @property
    def summary(self) -> str:
        return (self.out / "summary.md").read_text()

    @property
    def receipt(self) -> dict:
        return json.loads((self.out / "receipt.json").read_text())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("report") / "bundle"
    argv = ["run", "--nproc-per-node", "2", "--tp", "2"]
    argv += ["--out", str(out), "--timeout", "300", "--", SUITE]
    done = forked_cli.run(argv, cwd=REPO, timeout=420)
    return Run(out, done.returncode, done.stdout, done.stderr)


def test_every_rank_that_failed_the_same_assertion_is_named(run: Run) -> None:
    assert run.code == 1, run.stdout[-2000:] + run.stderr[-2000:]
    [failed] = run.receipt["failed_tests"]
    assert failed["nodeid"] == FAILING and failed["ranks"] == [0, 1]
    assert f"FAILED {FAILING} - ranks 0, 1: AssertionError" in run.stdout
    assert "1 failed, 1 passed, 4 skipped, 1 not run in " in run.stdout


def test_the_root_cause_is_said_once_without_torchrun_paths(run: Run) -> None:
    cause = run.receipt["root_cause"]["message"]
    assert "error.json" not in cause and "[torchrun:" not in cause
    assert "error.json" not in run.stdout
    assert run.stdout.count("the same assertion on every rank") == 1, run.stdout


def test_the_first_screen_says_what_was_qualified(run: Run) -> None:
    head = run.summary.split("```")[0]
    assert "TP2 / DCP2: **not the target geometry** (Kimi-K3 TP16 / DCP16 on 16 ranks)" in head
    assert "7 selected, 2 ran (1 passed, 1 failed), 4 skipped" in head
    assert "1 not run: stopped after 1 failure (--maxfail 1)" in head
    assert "  - 3 x needs 16 ranks" in head and "  - 1 x needs a CUDA GPU" in head
    assert "**Narrowing:** a custom suite" in head
    assert "**Verdict:** **FAIL**" in head


def test_skip_reasons_are_in_the_receipt_and_verified(run: Run) -> None:
    assert run.receipt["skip_reasons"] == {"needs 16 ranks": 3, "needs a CUDA GPU": 1}
    done = forked_cli.run(["verify", str(run.out)], cwd=REPO)
    assert done.returncode == 0, done.stdout


def test_a_custom_suite_carries_only_the_limitations_that_apply(run: Run) -> None:
    not_run = run.summary.split("## What did not run")[1].split("## Run")[0]
    assert "b12x-transport:" not in not_run and "real-trees:" not in not_run
    assert "Not applicable to a custom suite (kept in receipt.json)" in not_run
    assert "- nccl: NCCL did not run" in not_run  # a limitation that applies stays
    # what this run left out weighs most: first
    assert not_run.index("### Left out of this run") < not_run.index("- skipped: 4 test(s)")
    assert not_run.index("- skipped:") < not_run.index("### Not run on this machine")


def test_no_list_reprs_and_no_host_name_in_the_summary(run: Run) -> None:
    import socket

    assert "killed [" not in run.summary and "[]" not in run.summary
    assert socket.gethostname() not in run.summary


def test_each_rank_stack_dump_is_kept_under_one_name(run: Run) -> None:
    assert not list((run.out / "logs").glob("*.stacks"))


@pytest.fixture(scope="module")
def in_actions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    """The same suite as GitHub Actions runs it: GITHUB_ACTIONS=true and a step summary file."""
    root = tmp_path_factory.mktemp("actions")
    out, step = root / "bundle", root / "step-summary.md"
    step.write_text("earlier step\n")
    argv = ["run", "--nproc-per-node", "2", "--tp", "2"]
    argv += ["--out", str(out), "--timeout", "300", "--", SUITE]
    env = {**os.environ, "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(step)}
    done = forked_cli.run(argv, cwd=REPO, env=env, timeout=420)
    return Run(out, done.returncode, done.stdout, done.stderr), step


def test_in_github_actions_the_summary_goes_to_the_step_summary(in_actions) -> None:
    run, step = in_actions
    assert step.read_text() == "earlier step\n" + run.summary + "\n"


def test_in_github_actions_each_failed_test_is_an_error_annotation(in_actions) -> None:
    run, _ = in_actions
    errors = [ln for ln in run.stdout.splitlines() if ln.startswith("::error")]
    title = f"FAILED {FAILING} (ranks 0, 1)".replace(":", "%3A").replace(",", "%2C")
    assert errors == [
        f"::error file={SUITE},title={title}::AssertionError: the same assertion on every rank"
    ]


def test_outside_github_actions_there_are_no_annotations(run: Run) -> None:
    assert "::error" not in run.stdout
