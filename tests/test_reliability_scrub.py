"""A secret typed on the dcpqual command line itself never reaches the bundle: a real
`dcpqual run` at 2 ranks with an issued-looking token in its pytest arguments."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from _support.leaks import leaks
from _support.runs import SUITES, receipt

from harness.cli import main

pytestmark = [pytest.mark.torchrun]


def test_a_token_typed_on_the_command_line_is_scrubbed_from_the_bundle(tmp_path: Path) -> None:
    token = f"hf_typed{uuid.uuid4().hex}"
    out = tmp_path / "bundle"
    argv = ["run", "--nproc-per-node", "2", "--tp", "2", "--out", str(out)]
    code = main([*argv, "--", "-k", f"not {token}", str(SUITES / "rank_pass.py")])
    assert code == 0 and receipt(out)["verdict"] == "pass"
    assert leaks(out, token) == []
    assert main(["verify", str(out)]) == 0
