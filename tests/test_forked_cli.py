"""`_support.forked_cli`: a command forked from the worker's preloaded forkserver answers as the
same command started cold does (`python -m MODULE`), but for what its docstring says differs."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from _support import forked_cli

TESTS = Path(__file__).resolve().parent
PROBE = "_support.forked_cli_probe"


def both(what: str, cwd: Path, timeout: float = 60) -> dict[str, subprocess.CompletedProcess[str]]:
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    return {
        start: command([what], cwd=cwd, env=env, module=PROBE, timeout=timeout)
        for start, command in (("cold", forked_cli.cold), ("forked", forked_cli.run))
    }


@pytest.mark.parametrize(
    ("what", "code", "stderr"),
    [("exit-3", 3, ""), ("exit-text", 1, "stopped by the probe\n")],
)
def test_a_forked_command_is_started_and_ends_as_a_cold_one(
    tmp_path: Path, what: str, code: int, stderr: str
) -> None:
    done = both(what, tmp_path)
    facts = {start: json.loads(d.stdout) for start, d in done.items()}
    session = {start: f.pop("session_leader") for start, f in facts.items()}
    assert facts["forked"] == facts["cold"]
    assert facts["cold"]["process"] == "MainProcess" and facts["cold"]["start_method"] is None
    assert facts["cold"]["path0"] == str(tmp_path) == facts["cold"]["cwd"]
    assert session == {"cold": False, "forked": True}  # the one difference, as documented
    for d in done.values():
        assert (d.returncode, d.stderr) == (code, stderr)


def test_a_command_is_over_only_when_nothing_it_left_holds_its_output(tmp_path: Path) -> None:
    """As `subprocess.run` reads a pipe to its end: a child left holding stdout keeps the
    caller waiting (here `sleep 2`), or fails it at the timeout."""
    started = time.monotonic()
    done = both("leak", tmp_path)
    assert time.monotonic() - started > 2 * 2 - 0.5  # each start waited for its sleep
    assert {start: d.returncode for start, d in done.items()} == {"cold": 0, "forked": 0}
    with pytest.raises(subprocess.TimeoutExpired):
        forked_cli.run(["leak"], cwd=tmp_path, module=PROBE, timeout=1)


def test_without_the_wait_a_leaked_output_goes_unnoticed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the wait is what makes the test above hold."""
    monkeypatch.setattr(forked_cli, "_held", lambda paths: False)
    forked_cli.run(["leak"], cwd=tmp_path, module=PROBE, timeout=1)  # returns at once
