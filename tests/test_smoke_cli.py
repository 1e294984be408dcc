"""`dcpqual gpu-smoke`: one line and exit 2 without CUDA, nothing written; on a machine that has
one, exit 0 only for a passing smoke, with the bundle where --out says.

The GPU itself is faked only where it is needed: `cuda_problem` (the CUDA probe) and `run_smoke`
(the run on the device) are replaced; the bundle, the exit code and the report are real.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from _support import forked_cli
from _support.smoke import FAULTS, passing_result

from harness.cli import main
from harness.evidence.verify import verify_bundle
from harness.smoke import cli as smoke_cli
from harness.smoke import run as smoke_run

REPO = Path(__file__).resolve().parent.parent


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m harness gpu-smoke ARGS`, forked from a server that imported torch and never
    asked it for a device, so the variable still hides every GPU from the command."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    return forked_cli.run(["gpu-smoke", *args], cwd=cwd, env=env)


def test_without_cuda_it_says_so_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES="" hides every GPU, so this holds on a GPU machine too."""
    work = tmp_path / "work"
    work.mkdir()
    done = run_cli(["--out", str(tmp_path / "bundle")], cwd=work)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("dcpqual gpu-smoke: error: no CUDA device")
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (tmp_path / "bundle").exists()
    assert list(work.iterdir()) == []  # no default evidence/ folder either


def test_without_cuda_and_without_out_nothing_is_written(tmp_path: Path) -> None:
    done = run_cli([], cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("device", "needle"),
    [("cpu", "is not a CUDA device"), ("gpu:7", "is not a device name")],
)
def test_a_device_that_is_not_cuda_is_refused(
    device: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gpu-smoke", "--device", device, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "b").exists()


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A machine where the CUDA probe passes; the smoke's device run returns what is queued."""
    queued: list[str] = []

    def fake_run(config: smoke_run.SmokeConfig):  # type: ignore[no-untyped-def]
        fault = queued.pop(0) if queued else None
        result = passing_result()
        return result if fault is None else FAULTS[fault][0](result)

    monkeypatch.setattr(smoke_cli, "cuda_problem", lambda device: None)
    monkeypatch.setattr(smoke_run, "run_smoke", fake_run)
    return queued


def test_a_passing_smoke_exits_0_with_a_verified_bundle(
    fake_gpu: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    assert main(["gpu-smoke", "--out", str(out)]) == 0
    assert verify_bundle(out).problems == ()
    printed = capsys.readouterr().out
    assert "PASS smoke/gpu_smoke.py::test_capture[kimi-k3]" in printed
    assert "verdict pass" in printed and "## What did not run" in printed  # summary.md follows


@pytest.mark.parametrize("fault", ["capture-lazy-event", "control-no-work", "control-missing"])
def test_a_failing_smoke_exits_1_and_still_leaves_its_bundle(
    fault: str, fake_gpu: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_gpu.append(fault)
    out = tmp_path / "bundle"
    assert main(["gpu-smoke", "--out", str(out)]) == 1
    assert verify_bundle(out).problems == ()
    assert "FAIL" in capsys.readouterr().out


def test_an_out_folder_that_holds_files_is_refused_untouched(
    fake_gpu: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["gpu-smoke", "--out", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_gpu_smoke_is_listed_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "gpu-smoke" in capsys.readouterr().out
