"""How the rank plugin reads pytest's reports and rewrites them to tell the agreed verdict."""

from __future__ import annotations

import pytest

from harness.rank.plugin import RankPlugin, local_outcome
from harness.schema.rank_record import TestOutcome

NODE = "suites/x/test_y.py::test_z"


def report(when: str, outcome: str, longrepr: object = None) -> pytest.TestReport:
    return pytest.TestReport(NODE, ("x", 1, "test_z"), {}, outcome, longrepr, when)  # type: ignore[arg-type]


def protocol(setup: str = "passed", call: str | None = "passed", teardown: str = "passed"):
    reports = [report("setup", setup, "setup broke" if setup == "failed" else None)]
    if call is not None:
        reports.append(report("call", call, "assert 1 == 2" if call == "failed" else None))
    reports.append(report("teardown", teardown, "teardown broke" if teardown == "failed" else None))
    return reports


@pytest.mark.parametrize(
    "reports, expected",
    [
        (protocol(), ("passed", None)),
        (protocol(call="failed"), ("failed", "assert 1 == 2")),
        (protocol(setup="failed", call=None), ("error", "setup broke")),
        (protocol(teardown="failed"), ("error", "teardown broke")),
        (protocol(setup="skipped", call=None), ("skipped", None)),
    ],
)
def test_local_outcome(reports, expected):
    assert local_outcome(reports) == expected


def test_a_message_no_utf8_encoder_takes_is_escaped_not_lost():
    """A lone surrogate (from a non-UTF-8 path through os.fsdecode) would make the result
    unsendable to peers and the receipt unwritable; escaped, the failure itself arrives."""
    reports = [report("call", "failed", "open('/data/\udcff') failed")]
    outcome, message = local_outcome(reports)
    assert (outcome, message) == ("failed", "open('/data/\\udcff') failed")
    assert message is not None and message.encode("utf-8")


def test_a_rank_that_passed_a_failed_test_reports_it_failed_as_a_follow_on():
    reports = protocol()
    recorded = TestOutcome(
        NODE, "failed", message="follow-on: rank 1: boom", primary=False, failing_ranks=(1,)
    )
    RankPlugin._apply(reports, True, recorded)
    call = reports[1]
    assert call.failed and "[dcpqual] follow-on: rank 1: boom" in call.longreprtext
    assert [r.outcome for r in (reports[0], reports[2])] == ["passed", "passed"]


def test_a_secondary_failure_keeps_its_own_traceback_and_names_the_primary():
    reports = protocol(call="failed")
    recorded = TestOutcome(NODE, "failed", message="x", primary=False, failing_ranks=(3,))
    RankPlugin._apply(reports, True, recorded)
    assert "assert 1 == 2" in reports[1].longreprtext
    assert ("dcpqual", "secondary failure: rank(s) 3 failed this test first") in reports[1].sections


def test_a_passing_agreement_changes_nothing():
    reports = protocol(setup="skipped", call=None)
    RankPlugin._apply(reports, False, TestOutcome(NODE, "skipped"))
    assert [r.outcome for r in reports] == ["skipped", "passed"]
