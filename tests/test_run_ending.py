"""The pytest-style ending: which tests are listed as FAILED, in what order, with which rank and
message, and the tallies and rerun lines around them."""

from __future__ import annotations

from pathlib import Path

from harness.evidence.collect import RankFiles
from harness.evidence.short_summary import ending_lines, failed_tests, first_line
from harness.schema.rank_record import RankRecord, TestOutcome
from harness.schema.receipt import FailedTest, Receipt, RootCause, Run, Tally

A = "suites/x/test_a.py::test_one"
B = "suites/x/test_b.py::test_two[kimi-k3]"
C = "suites/x/test_c.py::test_three"


def record(rank: int, *tests: TestOutcome) -> RankRecord:
    return RankRecord(rank=rank, world_size=2, collected=(A, B, C), tests=tests, complete=True)


def fail(nodeid: str, message: str, *, primary: bool, by: tuple[int, ...]) -> TestOutcome:
    return TestOutcome(nodeid, "failed", message=message, primary=primary, failing_ranks=by)


def test_failed_tests_name_the_primary_rank_and_its_first_message_line():
    ranks = RankFiles(
        2,
        {
            0: record(0, fail(A, "[secondary] follow-on noise", primary=False, by=(1,))),
            1: record(
                1, fail(A, "AssertionError: bad combine\nassert 1 == 2", primary=True, by=(1,))
            ),
        },
    )
    [test] = failed_tests(ranks, None)
    assert test == FailedTest(
        nodeid=A, outcome="failed", ranks=[1], message="AssertionError: bad combine"
    )


def test_the_root_cause_comes_first_then_collection_order():
    ranks = RankFiles(
        2,
        {
            0: record(0, fail(A, "a", primary=True, by=(0,)), fail(C, "c", primary=True, by=(0,))),
            1: record(1, fail(B, "b", primary=True, by=(1,))),
        },
    )
    cause = RootCause(rank=1, test=B, message="b")
    assert [t.nodeid for t in failed_tests(ranks, cause)] == [B, A, C]
    assert [t.nodeid for t in failed_tests(ranks, None)] == [A, B, C]


def test_a_root_cause_no_record_lists_as_failed_is_still_listed():
    ranks = RankFiles(2, {0: record(0, TestOutcome(A, "passed"))})
    cause = RootCause(rank=1, test=B, message="killed while running\nmore", kind="killed")
    assert failed_tests(ranks, cause) == [
        FailedTest(nodeid=B, outcome="error", ranks=[1], message="killed while running")
    ]
    assert failed_tests(ranks, None) == []


def receipt(verdict: str, listed: list[FailedTest], **tally: int) -> Receipt:
    return Receipt.model_construct(
        verdict=verdict,
        failed_tests=listed,
        failures=["capture: 1 lazy event"] if verdict == "fail" else [],
        suites={"x": Tally(**tally)},
        run=Run(extra={"launch": {"elapsed_s": 80.34}}),
    )


def test_a_failing_ending_lists_failures_tallies_and_the_rerun_command():
    failed = [FailedTest(nodeid=B, outcome="failed", ranks=[3], message="boom")]
    lines = ending_lines(receipt("fail", failed, passed=4, failed=1, skipped=2), Path("/ev/run 1"))
    assert "short test summary info" in lines[0]
    assert lines[1] == f"FAILED {B} - rank 3: boom"
    assert "1 failed, 4 passed, 2 skipped in 80.3s (FAIL)" in lines[2]
    assert lines[2].startswith("=") and lines[2].endswith("=")
    assert lines[3] == "rerun the failed tests: dcpqual run --rerun-failed '/ev/run 1'"


def test_a_passing_ending_is_one_tallies_line():
    lines = ending_lines(receipt("pass", [], passed=5), Path("/ev/x"))
    assert len(lines) == 1 and "5 passed in 80.3s (PASS)" in lines[0]


def test_a_failed_run_without_failed_tests_names_its_reasons():
    lines = ending_lines(receipt("fail", [], passed=5), Path("/ev/x"))
    assert "FAILED run - capture: 1 lazy event" in lines
    assert not any(line.startswith("rerun") for line in lines)


def test_first_line_drops_the_secondary_marker_and_blank_lines():
    assert first_line("\n\n[secondary] x\ny") == "x"
    assert first_line(None) == ""
