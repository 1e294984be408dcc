"""The pytest-style ending of a run: the short summary of failures, the tallies line with the
wall time, and the command that reruns what failed.

Printed by `dcpqual run` after every run and placed at the top of summary.md, so what a pytest
user looks for first (`==== 1 failed, 154 passed in 80.3s ====`, `FAILED node::id - message`)
is where they expect it. `failed_tests` derives the list once, for the receipt, from the rank
records; everything else reads only the receipt.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from harness.evidence.collect import RankFiles
from harness.schema.rank_record import TestOutcome
from harness.schema.receipt import FailedTest, Receipt, RootCause

WIDTH = 80
_SECONDARY = "[secondary] "


def first_line(text: str | None) -> str:
    """The first non-empty line, without the marker of a follow-on failure."""
    line = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    return line.removeprefix(_SECONDARY)


def failed_tests(ranks: RankFiles, root_cause: RootCause | None) -> list[FailedTest]:
    """Every failed test, the root cause's first, then in collection order.

    The ranks named are the agreed primary ranks (`failing_ranks`, else the ranks that say their
    failure was primary), and every rank that failed the same way on its own: the agreement
    blames only the first of two ranks that fail one assertion, but both failed it. "The same
    way": its own failure (not a follow-on) with the primary's exception type. The message is
    the first of the primary ranks' own, else the first any rank recorded. A root cause at a
    test no rank recorded as failed (a rank killed mid-test) is listed too.
    """
    order: dict[str, int] = {}
    seen: dict[str, list[tuple[int, TestOutcome]]] = {}
    for rank in sorted(ranks.records):
        record = ranks.records[rank]
        for i, nodeid in enumerate(record.collected):
            order.setdefault(nodeid, i)
        for test in record.tests:
            if test.outcome in ("failed", "error"):
                seen.setdefault(test.nodeid, []).append((rank, test))
    found: dict[str, FailedTest] = {}
    for nodeid, entries in seen.items():
        blamed = sorted({r for _, t in entries for r in t.failing_ranks})
        blamed = blamed or sorted(rank for rank, t in entries if t.primary)
        own = [t for rank, t in entries if rank in blamed and t.primary]
        chosen = own[0] if own else entries[0][1]
        kind = _exception_type(chosen.message)
        alike = {
            rank
            for rank, t in entries
            if _own_failure(t.message) and kind and _exception_type(t.message) == kind
        }
        blamed = sorted(set(blamed) | alike)
        found[nodeid] = FailedTest(
            nodeid=nodeid,
            outcome="failed" if chosen.outcome == "failed" else "error",
            ranks=blamed,
            message=first_line(chosen.message),
        )
    if root_cause is not None and root_cause.test and root_cause.test not in found:
        found[root_cause.test] = FailedTest(
            nodeid=root_cause.test,
            outcome="error",
            ranks=[] if root_cause.rank is None else [root_cause.rank],
            message=first_line(root_cause.message),
        )
    first = root_cause.test if root_cause is not None else None
    return sorted(
        found.values(),
        key=lambda f: (f.nodeid != first, order.get(f.nodeid, len(order)), f.nodeid),
    )


def _own_failure(message: str | None) -> bool:
    """A rank's own failure: primary, or marked secondary by the agreement (a follow-on that
    only reports a peer's failure reads `follow-on: ...`)."""
    text = (message or "").lstrip()
    return not text.startswith("follow-on")


def _exception_type(message: str | None) -> str:
    """`AssertionError` of `AssertionError: x` (after a `[secondary] ` marker), else ''."""
    head = first_line(message).partition(":")[0].strip()
    return head if head.isidentifier() else ""


def ranks_rootdir(ranks: RankFiles) -> str | None:
    """The pytest rootdir the ranks report (`extra.rootdir`), lowest rank first."""
    for rank in sorted(ranks.records):
        rootdir = ranks.records[rank].extra.rootdir
        if rootdir:
            return rootdir
    return None


def _rule(text: str, char: str = "=") -> str:
    text = f" {text} "
    left = max(3, (WIDTH - len(text)) // 2)
    right = max(3, WIDTH - len(text) - left)
    return f"{char * left}{text}{char * right}"


def not_run_count(receipt: Receipt) -> int:
    """Tests some rank selected that have no outcome in the tallies (a --maxfail stop, a rank
    that ended early): pytest's own tallies would not show them, so a reader would not know."""
    if receipt.coverage is None:
        return 0
    counted = sum(t.passed + t.failed + t.skipped + t.errors for t in receipt.suites.values())
    return max(0, receipt.coverage.collected - counted)


def tallies_line(receipt: Receipt) -> str:
    """`1 failed, 4 passed, 1 skipped in 12.3s`, pytest's words and order."""
    counts = {"failed": 0, "passed": 0, "skipped": 0, "errors": 0}
    for tally in receipt.suites.values():
        counts["failed"] += tally.failed
        counts["passed"] += tally.passed
        counts["skipped"] += tally.skipped
        counts["errors"] += tally.errors
    parts = [f"{n} {word}" for word, n in counts.items() if n]
    if counts["errors"] == 1:
        parts[-1] = "1 error"
    not_run = not_run_count(receipt)
    if not_run:
        parts.append(f"{not_run} not run")
    launch = receipt.run.extra.launch
    wall = "" if launch is None else f" in {launch.elapsed_s:.1f}s"
    return f"{', '.join(parts) or 'no tests ran'}{wall}"


RERUN_PREFIX = "rerun the failed tests: "


def rerun_command(bundle: Path) -> str:
    return f"dcpqual run --rerun-failed {shlex.quote(str(bundle))}"


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "rank ?"
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def ending_lines(receipt: Receipt, bundle: Path | None) -> list[str]:
    """The closing block: short summary (failures only), tallies rule, rerun command."""
    lines: list[str] = []
    if receipt.verdict == "fail":
        lines.append(_rule("short test summary info"))
        for test in receipt.failed_tests:
            message = f" - {_ranks(test.ranks)}: {test.message}" if test.message else ""
            word = "FAILED" if test.outcome == "failed" else "ERROR"
            lines.append(f"{word} {test.nodeid}{message}")
        if not receipt.failed_tests:
            for reason in receipt.failures or ["the run failed"]:
                lines.append(f"FAILED run - {first_line(reason)}")
    lines.append(_rule(f"{tallies_line(receipt)} ({receipt.verdict.upper()})"))
    if receipt.failed_tests and bundle is not None:
        lines.append(f"{RERUN_PREFIX}{rerun_command(bundle)}")
    return lines
