"""The rank's fast exit (`bootstrap.exit_now`): the exit code is the one given, buffered output
and logging reach their files first, and interpreter teardown (atexit) is skipped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROGRAM = """
import atexit, logging, sys
from harness.rank.bootstrap import exit_now
logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
logging.getLogger("rank").info("logged before the exit")
atexit.register(lambda: print("teardown ran"))
sys.stdout.write("stdout without newline")
sys.stderr.write("stderr without newline")
exit_now(int(sys.argv[2]))
"""


def test_exit_now_flushes_output_and_skips_teardown(tmp_path: Path, repo_root: Path) -> None:
    log, code = tmp_path / "rank.log", 3
    # Block-buffered stdout (a pipe), as under torchrun's log redirection.
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(log), str(code)],
        capture_output=True,
        text=True,
        cwd=repo_root,
        env={"PYTHONPATH": str(repo_root), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == code, done.stderr
    assert done.stdout == "stdout without newline"
    assert done.stderr == "stderr without newline"
    assert "logged before the exit" in log.read_text()


def test_the_control_a_bare_os_exit_loses_buffered_output(tmp_path: Path, repo_root: Path) -> None:
    program = PROGRAM.replace("from harness.rank.bootstrap import exit_now", "from os import _exit")
    program = program.replace("exit_now(int(sys.argv[2]))", "_exit(0)")
    done = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path / "rank.log"), "0"],
        capture_output=True,
        text=True,
        cwd=repo_root,
        env={"PYTHONPATH": str(repo_root), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 0
    assert done.stdout == ""  # what the helper's flush is for
