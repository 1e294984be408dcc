"""A stand-in for torchrun: an agent that leaves a child in its own session, then hangs or exits."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from harness.launch.plan import RunOptions, build_plan

AGENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(600 if sys.argv[2] == "hang" else 1.0)  # "exit": leave the child behind
"""


def fake_plan(tmp_path: Path, mode: str, timeout_s: float):
    options = RunOptions(nproc_per_node=2, timeout_s=timeout_s, test_timeout_s=timeout_s / 2)
    plan = build_plan(options, tmp_path / "out")
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    pidfile = tmp_path / "child.pid"
    return replace(plan, argv=(sys.executable, str(script), str(pidfile), mode)), pidfile
