"""Where the GPU smoke runs the b12x channel/capture sequence, and the line where it cannot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.smoke import b12x_check
from harness.transport.b12x_backend import DeviceFacts

REPO = Path(__file__).resolve().parent.parent
RTX_PRO = DeviceFacts("", True, "cuda", (12, 0), "NVIDIA RTX PRO 6000", 2, "2.13.0")


def test_sm12x_with_b12x_and_two_gpus_runs_the_capture_suite_on_two_nccl_ranks() -> None:
    chosen = b12x_check.plan(RTX_PRO, out="/o/b12x", python="py")
    assert chosen.run and "sm_120" in chosen.reason
    assert chosen.command == (
        "py", "-m", "harness", "run", "--nproc-per-node", "2", "--backend", "nccl",
        "--tp", "16", "--dcp", "2", "--out", "/o/b12x", "--", b12x_check.SUITE,
    )  # fmt: skip
    assert chosen.line().startswith("b12x: RUN on 2 ranks")


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        (DeviceFacts("", True, "cuda", (9, 0), "NVIDIA H200", 1), "NVIDIA H200 is sm_90"),
        (DeviceFacts("", True, "cuda", (10, 0), "NVIDIA B200", 8), "sm_100"),
        (DeviceFacts("", True, "cuda", (12, 0), "NVIDIA RTX PRO 6000", 1), "at least 2 visible"),
        (DeviceFacts("ModuleNotFoundError: No module named 'b12x'", True), "not importable"),
        (DeviceFacts("", False, "cpu", torch_version="2.13.0+cpu"), "CUDA is not available"),
    ],
)
def test_elsewhere_it_says_plainly_that_it_could_not(facts: DeviceFacts, why: str) -> None:
    chosen = b12x_check.plan(facts)
    assert not chosen.run and chosen.command == ()
    line = chosen.line()
    assert line.startswith("b12x: NOT RUN: the b12x channel/capture sequence could not run here")
    assert why in line


def test_on_this_machine_the_module_prints_not_run_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness.smoke.b12x_check"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        env={"PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("b12x: NOT RUN: ")
