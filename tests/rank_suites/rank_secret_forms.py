"""The fault rank prints the run's secrets the ways tools do: assertion introspection (`repr`,
which escapes the quote and backslash in them), a logger's stripped copy of a value that ends in
a newline, and a file whose *name* holds a secret. GITHUB_PAT and NPM_AUTH are secrets too, and
MY_TOKEN is a word the receipt is made of."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from _world import fault_rank, rank

QUOTED = os.environ.get("DCPQUAL_TEST_TOKEN", "")
PAT = os.environ.get("GITHUB_PAT", "")
AUTH = os.environ.get("NPM_AUTH", "")


def test_prints_secrets_in_tool_forms(rank_plan):
    assert QUOTED and PAT and AUTH, "the test that launches this suite plants them"
    logging.getLogger("leaky").warning("pat %s auth %s", PAT.strip(), AUTH)
    print(f"{PAT.strip()}|{AUTH}")
    out = Path(str(rank_plan.out_dir)) / "notes"
    out.mkdir(exist_ok=True)
    (out / f"rank-{rank()}-{PAT.strip()}.txt").write_text("the name is the leak\n")


def test_fails_with_a_repr_of_the_token():
    assert rank() != fault_rank() or QUOTED == "expected", "introspection prints the repr"
