"""Reporting where CI shows it: in GitHub Actions (GITHUB_ACTIONS=true) the run's summary.md
goes to the job's step summary ($GITHUB_STEP_SUMMARY) and each failed test becomes an
`::error` annotation on its file, so a pull request's author reads the result on the page
instead of downloading the bundle."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from harness.evidence import markdown as md
from harness.schema.receipt import Receipt


def in_github_actions(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get("GITHUB_ACTIONS") == "true"


def _escape_data(text: str) -> str:
    """GitHub's escaping of a workflow command's message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """GitHub's escaping of a workflow command's property value."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def error_annotations(receipt: Receipt) -> list[str]:
    """One `::error` line per failed test (the FAILED line's words), on the test's file; a run
    that failed without a failed test gets one for the run."""
    lines = []
    for test in receipt.failed_tests:
        path = test.nodeid.split("::", 1)[0]
        ranks = ", ".join(map(str, test.ranks)) or "?"
        word = "FAILED" if test.outcome == "failed" else "ERROR"
        title = f"{word} {test.nodeid} (rank{'s' if len(test.ranks) > 1 else ''} {ranks})"
        lines.append(
            f"::error file={_escape_property(path)},title={_escape_property(title)}::"
            + _escape_data(test.message or word)
        )
    if receipt.verdict == "fail" and not receipt.failed_tests:
        reason = receipt.failures[0] if receipt.failures else "the run failed"
        lines.append(f"::error title=dcpqual run::{_escape_data(reason)}")
    return lines


def report_to_ci(
    stream: TextIO,
    receipt: Receipt,
    summary: Path,
    environ: Mapping[str, str] | None = None,
    *,
    problems: Sequence[str] = (),
) -> None:
    """In GitHub Actions: append summary.md to the step summary and print the annotations;
    elsewhere nothing. `problems`: why the bundle does not verify, said above the summary
    (whose headline is the receipt's verdict) and as an annotation of its own."""
    env = os.environ if environ is None else environ
    if not in_github_actions(env):
        return
    target = env.get("GITHUB_STEP_SUMMARY")
    if target and summary.is_file():
        with open(target, "a", encoding="utf-8") as out:
            if problems:
                out.write(f"> **{md.text(unverified(problems))}**\n\n")
            out.write(summary.read_text(encoding="utf-8"))
            out.write("\n")
    lines = error_annotations(receipt)
    if problems:
        lines.insert(0, f"::error title=dcpqual verify::{_escape_data(unverified(problems))}")
    for line in lines:
        stream.write(line + "\n")
    stream.flush()


def unverified(problems: Sequence[str]) -> str:
    """One line: the bundle does not verify, so the summary below is not evidence."""
    return (
        f"INVALID: this bundle does not verify ({len(problems)} problem(s), the first: "
        f"{problems[0]}); the verdict below stands for nothing"
    )
