"""A run whose bundle does not verify exits 1; what it shows must not end on its receipt's
PASS either: the terminal's last line and, in GitHub Actions, the step summary and annotations
say the bundle does not verify."""

from __future__ import annotations

import io
from pathlib import Path

from _support.evidence_factory import passing_run

from harness.evidence.writer import finalize_bundle
from harness.launch.ci import report_to_ci
from harness.launch.launcher import report

PROBLEM = "junit/rank-00.xml: tests/x.py::test_a is passed where records/rank-00.json says skipped"


def test_the_terminal_does_not_end_on_the_pass_of_a_bundle_that_does_not_verify(
    tmp_path: Path,
) -> None:
    out = tmp_path / "bundle"
    receipt = finalize_bundle(out, passing_run(out, world=2))
    assert receipt.verdict == "pass"
    clean, shown = io.StringIO(), io.StringIO()
    report(clean, out, receipt, [])
    assert "(PASS)" in clean.getvalue().rstrip().splitlines()[-1]  # a verified pass ends so
    report(shown, out, receipt, [PROBLEM])
    last = shown.getvalue().rstrip().splitlines()[-1]
    assert last == (
        f"dcpqual run: INVALID: the bundle does not verify (1 problem(s), the first: {PROBLEM}), "
        "so its verdict PASS stands for nothing"
    )


def test_in_github_actions_a_bundle_that_does_not_verify_is_said_above_its_summary(
    tmp_path: Path,
) -> None:
    out = tmp_path / "bundle"
    receipt = finalize_bundle(out, passing_run(out, world=2))
    step = tmp_path / "step-summary.md"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(step)}
    stream = io.StringIO()
    report_to_ci(stream, receipt, out / "summary.md", env, problems=[PROBLEM])
    text = step.read_text()
    assert text.startswith("> **INVALID: this bundle does not verify (1 problem(s), the first: ")
    assert text.endswith((out / "summary.md").read_text() + "\n")
    (annotation,) = stream.getvalue().splitlines()
    assert annotation.startswith("::error title=dcpqual verify::INVALID: this bundle does not")
