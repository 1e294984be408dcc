"""junit/merged.xml is what a CI test reporter reads of a run: each testcase's own result element
and each suite's counts. verify holds those to the per-rank outcomes it counts, and every rank's
case (outcome, message, source) to what the ranks' own reports merge to, so a forger who reseals
every hash (`_support.forge`) cannot show a failing run green there, nor blame another test or
reason, while the receipt keeps its FAIL. And each rank's own JUnit report, which the tallies
and so the verdict come from, cannot count a test better than that rank's record does."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import (
    NODES,
    context,
    failing_run,
    junit_xml,
    passed,
    torchrun_logs,
    write_rank,
)
from _support.evidence_factory import (
    failed as failed_outcome,
)
from _support.forge import forge

from harness.evidence import rederive as verify_rederive
from harness.evidence import verify
from harness.evidence.files import sha256_file
from harness.evidence.junit import mangle
from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle
from harness.schema.rank_record import TestOutcome

WORLD = 2


@pytest.fixture
def failed(tmp_path: Path) -> Path:
    """Rank 1 fails the combine test; rank 0 fails it as a follow-on."""
    out = tmp_path / "bundle"
    assert finalize_bundle(out, failing_run(out, world=WORLD, bad_rank=1)).verdict == "fail"
    assert verify_bundle(out).ok, verify_bundle(out).problems
    return out


def rewrite_merged(bundle: Path, edit: Any) -> None:
    """Edit merged.xml's text, then name its new hash in the receipt and reseal."""
    merged = bundle / "junit" / "merged.xml"
    merged.write_text(edit(merged.read_text()))

    def rehash(data: dict[str, Any]) -> None:
        data["files"]["junit/merged.xml"] = sha256_file(merged)

    assert forge(bundle, rehash).verdict == "fail"  # the receipt still says FAIL


def test_a_failing_run_cannot_show_green_to_a_test_reporter(
    failed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failure elements dropped and the counts zeroed: a reporter would count 0 failures;
    the per-rank properties, which the tallies count, still say failed."""

    def green(text: str) -> str:
        text = re.sub(r"<failure[^>]*?(/>|>.*?</failure>)", "", text, flags=re.S)
        return re.sub(r'(failures|errors)="\d+"', r'\1="0"', text)

    rewrite_merged(failed, green)
    with monkeypatch.context() as patch:
        patch.setattr(verify, "reader_problems", lambda *_: [])
        assert verify_bundle(failed).ok  # every other layer is fooled
    assert verify_bundle(failed).problems == (
        "junit/merged.xml: testcase suites.transport.test_combine.TestCombine::"
        "test_matches_reference shows passed where its ranks' outcomes make it failed",
    )


def test_a_suite_count_zeroed_in_merged_xml_is_caught(failed: Path) -> None:
    rewrite_merged(failed, lambda text: text.replace('failures="1"', 'failures="0"'))
    problems = verify_bundle(failed).problems
    assert problems and all(p.startswith("junit/merged.xml: testsuite") for p in problems[:-1])
    assert problems[-1] == (
        "junit/merged.xml: testsuites says failures=0 where its testcases count 1"
    )


def test_merged_xml_cannot_name_another_reason_for_a_failure(failed: Path) -> None:
    """The message a reviewer reads in the CI report is the ranks' own, not one the forger chose
    (the counts are unchanged, so the tallies alone cannot tell)."""
    real = "AssertionError: combine mismatch at head 3"
    rewrite_merged(failed, lambda text: text.replace(real, "flaky network: connection reset"))
    (problem,) = verify_bundle(failed).problems
    assert problem.startswith("junit/merged.xml: cases.rank 01 ")
    assert problem.endswith(
        ".message is 'flaky network: connection reset' but the rank records and JUnit reports "
        f"say {real!r}"
    )


SKIPPED = [TestOutcome(nodeid=n, outcome="skipped", message="needs a GPU") for n in NODES]


def skipped_everywhere(out: Path, reported: list[TestOutcome]) -> Path:
    """A bundle whose ranks all recorded every test skipped, while each rank's own JUnit report
    says `reported`: the writer, which tallies the reports, calls it a pass."""
    for rank in range(WORLD):
        write_rank(out, rank, WORLD, tests=SKIPPED, junit=False)
        report = out / "junit" / f"rank-{rank:02d}.xml"
        report.parent.mkdir(exist_ok=True)
        report.write_text(junit_xml(reported))
    torchrun_logs(out, WORLD)
    assert finalize_bundle(out, context(WORLD)).verdict == "pass"
    return out


def test_the_ranks_reports_cannot_pass_tests_their_records_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every test skipped on every rank proves nothing and fails ("no test passed"); with the
    ranks' JUnit reports alone rewritten to say passed, the writer's own derivation gives a
    PASS: verify holds each report to its rank's record."""
    out = skipped_everywhere(tmp_path / "bundle", [passed(n) for n in NODES])
    with monkeypatch.context() as patch:
        patch.setattr(verify_rederive, "junit_record_problems", lambda *_: [])
        assert verify_bundle(out).ok  # every other layer is fooled
    assert verify_bundle(out).problems == tuple(
        f"junit/rank-{rank:02d}.xml: {NODES[0]} is passed where records/rank-{rank:02d}.json "
        "says skipped"
        for rank in range(WORLD)
    )


def test_the_ranks_reports_cannot_pass_a_test_their_records_never_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same skips, reported as skips, and one made-up test each report says passed: a PASS
    by the tallies, of a test no rank collected."""
    made_up = "suites/warm/test_made_up.py::test_it_ran"
    out = skipped_everywhere(tmp_path / "bundle", [*SKIPPED, passed(made_up)])
    with monkeypatch.context() as patch:
        patch.setattr(verify_rederive, "junit_record_problems", lambda *_: [])
        assert verify_bundle(out).ok  # every other layer is fooled
    assert verify_bundle(out).problems == tuple(
        f"junit/rank-{rank:02d}.xml: suites.warm.test_made_up::test_it_ran is passed, but "
        f"records/rank-{rank:02d}.json names no such test"
        for rank in range(WORLD)
    )


@pytest.mark.parametrize("kept", ["the-other-tests", "no-test"])
def test_the_ranks_reports_cannot_leave_out_a_test_their_records_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: str
) -> None:
    """Every rank recorded the combine test failed; each rank's own JUnit report leaves its
    case out: the tallies and merged.xml, which come from the reports, show no failure, and the
    writer's own derivation gives a PASS with the launch's exit code 0 (with no case at all, a
    FAIL for want of a pass). verify holds each report to every test its rank's record has an
    outcome for, naming a failure first."""
    out = tmp_path / "bundle"
    tests = [passed(n) for n in NODES if n != NODES[1]] + [failed_outcome(NODES[1], "mismatch")]
    reported = [t for t in tests if t.outcome == "passed"] if kept == "the-other-tests" else []
    for rank in range(WORLD):
        write_rank(out, rank, WORLD, tests=tests, junit=False)
        report = out / "junit" / f"rank-{rank:02d}.xml"
        report.parent.mkdir(exist_ok=True)
        report.write_text(junit_xml(reported))
    torchrun_logs(out, WORLD)
    verdict = "pass" if reported else "fail"
    assert finalize_bundle(out, context(WORLD)).verdict == verdict
    with monkeypatch.context() as patch:
        patch.setattr(verify_rederive, "junit_record_problems", lambda *_: [])
        assert verify_bundle(out).ok  # every other layer is fooled
    assert verify_bundle(out).problems == tuple(
        f"junit/rank-{rank:02d}.xml: has no case of {NODES[1]}, which "
        f"records/rank-{rank:02d}.json says failed"
        for rank in range(WORLD)
    )


def test_the_ranks_reports_cannot_pass_tests_their_records_never_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session ended after the combine test failed: the last two collected tests have no
    outcome on any rank. Each rank's report calls them passed: the run still fails, but the
    tallies, merged.xml and the summary would count them as ran and passed."""
    out = tmp_path / "bundle"
    tests = [passed(NODES[0]), failed_outcome(NODES[1], "mismatch")]
    for rank in range(WORLD):
        write_rank(out, rank, WORLD, tests=tests, junit=False)
        report = out / "junit" / f"rank-{rank:02d}.xml"
        report.parent.mkdir(exist_ok=True)
        report.write_text(junit_xml([*tests, passed(NODES[2]), passed(NODES[3])]))
    torchrun_logs(out, WORLD)
    written = finalize_bundle(out, context(WORLD, exit_code=1))
    assert sum(t.passed for t in written.suites.values()) == 3
    with monkeypatch.context() as patch:
        patch.setattr(verify_rederive, "junit_record_problems", lambda *_: [])
        assert verify_bundle(out).ok  # every other layer is fooled
    classname, name = mangle(NODES[2])
    assert verify_bundle(out).problems == tuple(
        f"junit/rank-{rank:02d}.xml: {classname}::{name} is passed, but "
        f"records/rank-{rank:02d}.json has no outcome for it"
        for rank in range(WORLD)
    )


def test_a_report_made_up_for_a_rank_that_wrote_none_is_not_believed(tmp_path: Path) -> None:
    """Ranks run without pytest's junitxml (`-p no:junitxml`) leave no report, and the `ranks`
    limitation, which denies `qualified`, says their cases were rebuilt from their records. A
    forger writes each a report from its record and lets the writer's own derivation make the
    bundle: the records say junitxml wrote them none, so those reports are not theirs."""
    out = tmp_path / "bundle"
    for rank in range(WORLD):
        write_rank(out, rank, WORLD, writes_junit=False)  # and a report made up from the record
    torchrun_logs(out, WORLD)
    written = finalize_bundle(out, context(WORLD))
    assert written.ranks.missing_junit == [0, 1]
    assert "ranks" in written.limitation_keys()
    assert any("junit/rank-01.xml is not rank 1's" in line for line in written.limitations)
    assert verify_bundle(out).ok, verify_bundle(out).problems


def test_a_test_that_also_errored_in_teardown_verifies_as_pytest_reports_it(
    tmp_path: Path,
) -> None:
    """pytest writes a test that failed and then errored in teardown as two testcases, and one
    that skipped and then errored as one testcase with both elements: an honest bundle of
    either verifies (each rank's entries read back in order; a suite's counts as a reporter
    counts them, each result element)."""
    out = tmp_path / "bundle"
    twice, both = NODES[1], NODES[2]
    tests = [passed(NODES[0]), TestOutcome(nodeid=twice, outcome="failed", message="call")]
    tests += [TestOutcome(nodeid=both, outcome="error", message="teardown"), passed(NODES[3])]
    teardown = '<error message="teardown">broke</error>'
    for rank in range(WORLD):
        write_rank(out, rank, WORLD, tests=tests, junit=False)
        xml = junit_xml([passed(NODES[0]), passed(twice), passed(both), passed(NODES[3])])
        for nodeid, inner in (
            (twice, '<failure message="call">x</failure></testcase>{case}' + teardown),
            (both, '<skipped message="not here">s</skipped>' + teardown),
        ):
            classname, name = mangle(nodeid)
            case = f'<testcase classname="{classname}" name="{name}" time="0.25"'
            xml = xml.replace(
                case + " />", case + ">" + inner.format(case=case + ">") + "</testcase>"
            )
        report = out / "junit" / f"rank-{rank:02d}.xml"
        report.parent.mkdir(exist_ok=True)
        report.write_text(xml)
    torchrun_logs(out, WORLD)
    written = finalize_bundle(out, context(WORLD, exit_code=1))
    assert (written.verdict, sum(t.failed for t in written.suites.values())) == ("fail", 1)
    assert verify_bundle(out).ok, verify_bundle(out).problems
