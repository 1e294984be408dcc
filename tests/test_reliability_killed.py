"""A launcher killed by SIGKILL (as the OOM killer kills) runs no ending; its guardian scrubs
the out folder once the run's processes are gone, so no raw secret stays on disk. Killed with
its guardian, the ranks' output and records on disk still hold no raw secret: they were
scrubbed as they were written. A real `dcpqual run` at 2 ranks in a process of its own, killed
while its ranks wait in a test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from _support.leaks import leaks
from _support.runs import SUITES, processes_of_run, ranks_inside, wait_until

from harness.core.secrets import SCRUBBED

pytestmark = [pytest.mark.torchrun]
REPO = Path(__file__).resolve().parents[1]


def start_run(tmp_path: Path, token: str) -> tuple[Path, subprocess.Popen[bytes]]:
    """A 2-rank run of the suite that spills `token`, once its ranks wait in its long test."""
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
    except BaseException:
        launcher.kill()
        launcher.wait()
        raise
    return out, launcher


def guardian_of(out: Path) -> psutil.Process:
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "harness.launch.guardian" in cmdline and str(out) in cmdline:
            return process
    raise AssertionError("the launcher started no guardian")


def test_a_sigkilled_launcher_leaves_no_raw_secret_on_disk(tmp_path: Path) -> None:
    token = f"hf_killed{uuid.uuid4().hex}"
    out, launcher = start_run(tmp_path, token)
    try:
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


def test_killed_with_its_guardian_the_ranks_output_and_records_hold_no_raw_secret(
    tmp_path: Path,
) -> None:
    token = f"hf_killed{uuid.uuid4().hex}"
    out, launcher = start_run(tmp_path, token)
    try:
        guardian_of(out).kill()
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert wait_until(lambda: not processes_of_run(out), 90), processes_of_run(out)
        left = leaks(out, token)
        logs = sorted((out / "torchrun").glob("node-00/*/attempt_0/*/stdout.log"))
        assert len(logs) == 2
        assert all(f"spilled {SCRUBBED}" in log.read_text() for log in logs)
        # Only what the test wrote itself, which no scrub ran on; the ranks' output and
        # records were scrubbed as they were written.
        assert {f.split("/")[0] for f in left} == {"notes"}, left
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
