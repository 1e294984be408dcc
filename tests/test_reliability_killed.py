"""A launcher killed by SIGKILL (as the OOM killer kills) runs no ending; its guardian scrubs
the out folder once the run's processes are gone, so no raw secret stays on disk. A real
`dcpqual run` at 2 ranks in a process of its own, killed while its ranks wait in a test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from _support.leaks import leaks
from _support.runs import SUITES, processes_of_run, ranks_inside, wait_until

pytestmark = [pytest.mark.torchrun, pytest.mark.xdist_group("torchrun")]
REPO = Path(__file__).resolve().parents[1]


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
        assert wait_until(lambda: ranks_inside(out, 2, "test_waits_for_the_interrupt"), 120), (
            "the ranks never reached the test"
        )
        assert leaks(out, token), "the check below could not fail: no secret was written"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert wait_until(lambda: not processes_of_run(out) and not leaks(out, token), 90), leaks(
            out, token
        )
        assert not (out / "receipt.json").exists()  # no ending ran: no bundle is claimed
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
