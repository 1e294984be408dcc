"""Acceptance: a recognizer that computes a wrong capacity or dtype is caught by the capture
suite (2 gloo ranks under `dcpqual run`), because the decode step keys transports on what the
layers' own forward hands over."""

from __future__ import annotations

from pathlib import Path

import pytest
from _support import forked_cli

pytestmark = [pytest.mark.torchrun, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("mutant", "lazy"),
    [
        ("warm_kimi_wrong_capacity", "(bf16, dcp=2, max_tokens=8, cpu)"),
        ("warm_kimi_wrong_output_dtype", "(bf16, dcp=2, max_tokens=8, cpu)"),
    ],
)
def test_capture_suite_catches_a_wrong_kimi_signature(mutant: str, lazy: str, tmp_path) -> None:
    argv = ["run", "--nproc-per-node", "2", "--timeout", "300"]
    argv += ["--warm-impl", f"tests._support.mutant_warm:{mutant}", "--out", str(tmp_path / "o")]
    argv += ["--", "suites/capture/test_capture.py", "-k", "kimi"]
    done = forked_cli.run(argv, cwd=REPO_ROOT, timeout=400)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    # The layers asked for the true Kimi-K3 transport (12 heads at TP16/DCP2), never warmed.
    assert "registry miss" in output and f"12 heads x 576 -> 512 {lazy}" in output, output[-3000:]
