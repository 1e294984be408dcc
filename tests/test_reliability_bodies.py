"""A run passes only when its test bodies ran: real `dcpqual run` launches at 2 ranks.

pytest's `--setup-only` (and `--setup-plan`, or a conftest that sets either) runs setup and
teardown and never the call phase: every phase it reports passes, so a test that asserts False
looked passed. The rank plugin records such a test as a skip that says no body ran, junit says
skipped, the run fails with the `test-bodies` limitation, verify holds it, and `compare` never
calls such a run an improvement over a failing one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _support.runs import SUITES, Launched, receipt, records

from harness.cli import main

pytestmark = [pytest.mark.torchrun]

WORLD = 2


def launch(out: Path, *pytest_args: str) -> int:
    argv = ["run", "--nproc-per-node", str(WORLD), "--tp", str(WORLD), "--out", str(out)]
    return main([*argv, "--", *pytest_args])


def hooked_suite(base: Path, name: str, option: str, body: str) -> str:
    """A suite whose conftest turns pytest's `option` on itself: no option on the command line
    (where `dcpqual run` refuses `--setup-only`, `--setup-plan` and `--collect-only` before
    launch), so only the post-run rules can tell."""
    suite = base / f"suite-{name}"
    suite.mkdir()
    (suite / "conftest.py").write_text(
        f"def pytest_configure(config):\n    config.option.{option} = True\n"
    )
    (suite / f"test_{name.replace('-', '_')}.py").write_text(body)
    return str(suite)


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, rank_assert_run: Launched
) -> dict[str, tuple[int, Path]]:
    """One launch each: the failing suite rank_assert.py as is (the session's, which
    tests/test_run_ux.py reads too), and suites whose conftest turns on pytest's setup-only or
    collect-only mode."""
    base = tmp_path_factory.mktemp("bodies")
    failing = "def test_body():\n    assert False\n"
    three = "".join(f"def test_{n}():\n    assert False\n" for n in range(3))
    [code] = rank_assert_run.codes
    out = {"plain": (code, rank_assert_run.out)}
    for name, args in {
        "hooked": (hooked_suite(base, "hooked", "setuponly", failing),),
        "collect-only": (hooked_suite(base, "collect-only", "collectonly", three),),
    }.items():
        folder = base / name
        out[name] = (launch(folder, *args), folder)
    return out


def test_the_options_that_skip_test_bodies_are_refused_before_launch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = str(SUITES / "rank_assert.py")
    for option in ("--setup-only", "--setup-plan", "--collect-only"):
        assert launch(tmp_path / option.strip("-"), option, suite) == 2
        assert capsys.readouterr().err.count("\n") == 1
        assert not (tmp_path / option.strip("-")).exists()


def test_a_run_whose_call_phases_never_ran_fails_and_says_so(
    runs: dict[str, tuple[int, Path]],
) -> None:
    code, out = runs["hooked"]
    data: dict[str, Any] = receipt(out)
    assert code == 1 and data["verdict"] == "fail" and data["status"] == "not-qualified"
    keys = {item["key"]: item["text"] for item in data["limitation_items"]}
    assert "no test body ran" in keys["test-bodies"]
    assert any("no test body ran" in r for r in data["failures"])
    assert sum(t["passed"] for t in data["suites"].values()) == 0
    for record in records(out).values():
        assert record.tests and all(t.outcome == "skipped" and t.no_body for t in record.tests)
    assert main(["verify", str(out)]) == 0


def test_a_run_that_only_collected_fails_with_every_test_without_an_outcome(
    runs: dict[str, tuple[int, Path]],
) -> None:
    code, out = runs["collect-only"]
    data = receipt(out)
    assert code == 1 and data["verdict"] == "fail" and data["status"] == "not-qualified"
    assert data["coverage"]["without_outcome"] == 2 * 3  # 3 tests on each of 2 ranks
    assert main(["verify", str(out)]) == 0


def test_a_run_whose_bodies_ran_has_no_such_limitation(runs: dict[str, tuple[int, Path]]) -> None:
    """Negative control: the same suite run plainly fails on its assertion, not on bodies."""
    code, out = runs["plain"]
    data = receipt(out)
    assert code == 1 and data["coverage"]["no_body"] == 0
    assert "test-bodies" not in {item["key"] for item in data["limitation_items"]}


def test_compare_never_calls_a_bodiless_run_an_improvement(
    runs: dict[str, tuple[int, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, plain = runs["plain"]
    _, bodiless = runs["hooked"]
    capsys.readouterr()
    assert main(["compare", str(plain), str(bodiless), "--json"]) == 1
    comparison = json.loads(capsys.readouterr().out)
    assert comparison["improvements"] == []
    assert any("no test body" in r for r in comparison["regressions"])
