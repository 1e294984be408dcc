"""multiprocessing's forkserver started as a fork of the preloaded agent
(`harness.launch.forkserver_start`): it holds what its parent imported, none of its parent's
files, and no lock its parent held; the command multiprocessing would exec is run as `-c` runs
it, exit code included. Each case runs in a fresh interpreter, single-threaded as the agent is
when it forks (tests/_support/forkserver_start_probe.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.launch.plan import REPO_ROOT

PROBE = Path(__file__).parent / "_support" / "forkserver_start_probe.py"


def probe(*args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, str(PROBE), *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    facts: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    facts["stderr"] = done.stderr
    return facts


def test_the_forked_server_holds_its_parents_imports_and_none_of_its_files(
    tmp_path: Path,
) -> None:
    facts = probe("forked", str(tmp_path / "held.txt"))
    assert facts["forked"] == [facts["server"]]
    assert facts["server_cmdline_is_mine"], "not a fork of this process"
    assert facts["child"]["marker"], "the server's children lack what the parent imported"
    assert not facts["server_holds_the_file"], "an fd of the parent's was left open in the server"
    assert facts["child"]["start_lock_free"], "the parent's held start lock reached the children"
    assert facts["child_exit"] == 0


def test_without_it_the_server_is_a_fresh_interpreter_without_the_parents_imports(
    tmp_path: Path,
) -> None:
    """The control: as multiprocessing starts it, the server is exec'd and imports afresh."""
    facts = probe("exec", str(tmp_path / "held.txt"))
    assert facts["forked"] == []
    assert not facts["server_cmdline_is_mine"]
    assert not facts["child"]["marker"]
    assert facts["child"]["start_lock_free"] and facts["child_exit"] == 0


@pytest.mark.parametrize(
    ("text", "code", "printed"),
    [
        ("pass", 0, None),
        ("import sys; sys.exit(3)", 3, None),
        ("import sys; sys.exit(2 ** 70)", 255, None),
        ("raise ValueError('the server broke')", 1, "ValueError: the server broke"),
        ("import sys; sys.exit('said on the way out')", 1, "said on the way out"),
    ],
    ids=["returns", "exit-3", "exit-too-large", "raises", "exit-text"],
)
def test_the_forked_command_exits_as_python_dash_c_would(
    text: str, code: int, printed: str | None
) -> None:
    facts = probe("exit", text)
    assert facts["exit"] == code, facts
    if printed is not None:
        assert printed in facts["stderr"], facts["stderr"]
