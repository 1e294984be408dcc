"""`--rerun-failed` against a bundle that verifies but was written by someone else: it runs
only node ids under the recorded absolute rootdir and never a plugin the receipt names.

The bundle is an honest one from the evidence factory, its receipt edited and verify told it
is fine (a forged bundle whose hashes are its own verifies unless it is signed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import failing_run

from harness.cli import main
from harness.evidence import verify
from harness.evidence.writer import finalize_bundle
from harness.launch import launcher
from harness.launch.plan import RunOptions


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[RunOptions]:
    seen: list[RunOptions] = []
    monkeypatch.setattr(launcher, "run", lambda options, **kw: seen.append(options) or 0)
    return seen


@pytest.fixture
def bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    out = tmp_path / "failed"
    finalize_bundle(out, failing_run(out, world=2, bad_rank=1))
    honest = verify.verify_bundle(out)
    assert honest.ok
    monkeypatch.setattr(verify, "verify_bundle", lambda path: honest)  # its hashes agree
    return out


def edit(bundle: Path, **run: Any) -> None:
    path = bundle / "receipt.json"
    data = json.loads(path.read_text())
    data["run"].update(run)
    path.write_text(json.dumps(data))


def failed_nodeid(bundle: Path) -> str:
    return json.loads((bundle / "receipt.json").read_text())["failed_tests"][0]["nodeid"]


def test_an_honest_rerun_runs_the_failed_test_under_the_rootdir(bundle, launched) -> None:
    """Negative control for the refusals below."""
    edit(bundle, rootdir="/srv/checkout", pytest_args=["-p", "evil", "suites"])
    assert main(["run", "--rerun-failed", str(bundle)]) == 0
    [options] = launched
    assert options.pytest_args == (f"/srv/checkout/{failed_nodeid(bundle)}",)  # no -p evil


def test_a_rerun_names_only_the_plugins_it_is_given(bundle, launched) -> None:
    edit(bundle, rootdir="/srv/checkout", pytest_args=["-p", "evil", "suites"])
    assert main(["run", "--rerun-failed", str(bundle), "--", "-p", "mine"]) == 0
    assert launched[0].pytest_args[:2] == ("-p", "mine")
    assert "evil" not in launched[0].pytest_args


@pytest.mark.parametrize("rootdir", [".", "bundle/code", None])
def test_a_receipt_without_an_absolute_rootdir_is_refused(
    bundle, launched, capsys, rootdir
) -> None:
    edit(bundle, rootdir=rootdir)
    assert main(["run", "--rerun-failed", str(bundle)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "records no absolute rootdir" in line and launched == []


@pytest.mark.parametrize("nodeid", ["../../tmp/evil.py::t", "/tmp/evil.py::t"])
def test_a_failed_test_outside_the_rootdir_is_refused(bundle, launched, capsys, nodeid) -> None:
    path = bundle / "receipt.json"
    data = json.loads(path.read_text())
    data["run"]["rootdir"] = "/srv/checkout"
    data["failed_tests"][0]["nodeid"] = nodeid
    path.write_text(json.dumps(data))
    assert main(["run", "--rerun-failed", str(bundle)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "is not under the run's rootdir /srv/checkout" in line and launched == []


def test_a_rerun_refuses_pytest_arguments_other_than_plugins(bundle, launched, capsys) -> None:
    assert main(["run", "--rerun-failed", str(bundle), "--", "-p", "x", "-k", "y"]) == 2
    assert "give no pytest arguments but the plugins" in capsys.readouterr().err
