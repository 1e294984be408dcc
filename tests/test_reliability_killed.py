"""A launcher killed by SIGKILL (as the OOM killer kills) runs no ending; its guardian scrubs
the out folder once the run's processes are gone, so no raw secret stays on disk. A real
`dcpqual run` at 2 ranks in a process of its own, killed while its ranks wait in a test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from _support.leaks import leaks
from _support.runs import SUITES, processes_of_run, records

pytestmark = [pytest.mark.torchrun, pytest.mark.xdist_group("torchrun")]
REPO = Path(__file__).resolve().parents[1]


def _wait_until(check, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def _both_waiting(out: Path) -> bool:
    try:
        recs = records(out)
    except (OSError, ValueError):
        return False
    running = [r.current_test or "" for r in recs.values()]
    return len(running) == 2 and all("::test_waits_for_the_interrupt" in t for t in running)


def test_a_sigkilled_launcher_leaves_no_raw_secret_on_disk(tmp_path: Path) -> None:
    token = f"hf_killed{uuid.uuid4().hex}"
    out = tmp_path / "bundle"
    env = {**os.environ, "HF_TOKEN": token, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "harness", "run", "--nproc-per-node", "2", "--tp", "2"]
    argv += ["--out", str(out), "--", str(SUITES / "rank_killed.py")]
    launcher = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path
    )
    try:
        assert _wait_until(lambda: _both_waiting(out), 120), "the ranks never reached the test"
        assert leaks(out, token), "the check below could not fail: no secret was written"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert _wait_until(lambda: not processes_of_run(out) and not leaks(out, token), 90), leaks(
            out, token
        )
        assert not (out / "receipt.json").exists()  # no ending ran: no bundle is claimed
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
