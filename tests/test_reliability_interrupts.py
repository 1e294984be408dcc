"""Signals back to back, any order and mix: every one that arrives while an ending is being
prepared is held, and the run still leaves a scrubbed bundle that verifies. Real `dcpqual run`
launches at 2 ranks (the launcher is this process, as in tests/test_reliability_endings.py).
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest
from _support.leaks import leaks, main_thread_only, signal_when_running
from _support.runs import processes_of_run, receipt, run

from harness.cli import main

pytestmark = [pytest.mark.torchrun]


@main_thread_only
@pytest.mark.parametrize(
    "sigs",
    # Each order of the two signals first, and a repeat of each: a plain SIGTERM-then-^C is the
    # start of the second case, so it is not launched on its own.
    [
        (signal.SIGINT, signal.SIGTERM),
        (signal.SIGTERM, signal.SIGTERM, signal.SIGINT, signal.SIGINT),
    ],
    ids=["int-term", "term-term-int-int"],
)
def test_signals_back_to_back_leave_a_scrubbed_verified_bundle(
    sigs: tuple[signal.Signals, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = f"hf_backtoback{uuid.uuid4().hex}"
    monkeypatch.setenv("HF_TOKEN", token)
    out = tmp_path / "bundle"
    sender = signal_when_running(out, 2, "test_waits_for_the_interrupt", *sigs)
    code, elapsed = run(out, 2, "rank_interrupt.py")
    sender.join()
    assert elapsed < 90
    named = receipt(out)["run"]["extra"]["launch"]["interrupted"]["signal"]
    assert named in {s.name for s in sigs}
    assert code == 128 + signal.Signals[named]
    assert (out / "SHA256SUMS").is_file()
    assert receipt(out)["root_cause"]["kind"] == "interrupted"
    assert main(["verify", str(out)]) == 0
    assert leaks(out, token) == []
    assert processes_of_run(out) == []
