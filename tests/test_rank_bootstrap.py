"""The rank's fast exit (`bootstrap.exit_now`): the exit code is the one given, buffered output,
logging and the files a test left open reach their files first, and interpreter teardown
(atexit) is skipped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROGRAM = """
import atexit, logging, sys
from harness.rank.bootstrap import exit_now
from harness.rank.openfiles import freeze
logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
logging.getLogger("rank").info("logged before the exit")
left_open = open(sys.argv[3], "w")
left_open.write("left open, never flushed")
freeze()  # as the rank heap (harness.rank.heap) freezes what collection built
atexit.register(lambda: print("teardown ran"))
sys.stdout.write("stdout without newline")
sys.stderr.write("stderr without newline")
exit_now(int(sys.argv[2]))
"""


def test_exit_now_flushes_output_and_skips_teardown(tmp_path: Path, repo_root: Path) -> None:
    log, code, left = tmp_path / "rank.log", 3, tmp_path / "left-open"
    # Block-buffered stdout (a pipe), as under torchrun's log redirection.
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(log), str(code), str(left)],
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
    assert left.read_text() == "left open, never flushed"


def test_the_control_a_bare_os_exit_loses_buffered_output(tmp_path: Path, repo_root: Path) -> None:
    program = PROGRAM.replace("from harness.rank.bootstrap import exit_now", "from os import _exit")
    program = program.replace("exit_now(int(sys.argv[2]))", "_exit(0)")
    left = tmp_path / "left-open"
    done = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path / "rank.log"), "0", str(left)],
        capture_output=True,
        text=True,
        cwd=repo_root,
        env={"PYTHONPATH": str(repo_root), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 0
    assert done.stdout == ""  # what the helper's flush is for
    assert left.read_text() == ""
