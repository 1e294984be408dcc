"""What a forkserver rank exits with for a SystemExit (`harness.rank.interpreter.exit_code`) is
what a cold `python` exits with for it: the same code, however large or odd."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.rank.interpreter import exit_code

CODES = ["None", "0", "3", "-1", "256", "2**40", "2**63", "2**70", "-2**70", "True", "'bye'"]


@pytest.mark.parametrize("code", CODES)
def test_a_system_exit_ends_a_forked_rank_with_the_code_a_cold_interpreter_exits_with(
    code: str,
) -> None:
    cold = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.exit({code})"], capture_output=True, check=False
    )
    assert exit_code(SystemExit(eval(code))) == cold.returncode, code
