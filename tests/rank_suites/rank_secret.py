"""Every rank spills the run's HF_TOKEN where careless tests do; the fault rank fails with it.

The token reaches stdout, stderr, a log record, a test id, an assertion message (so the records,
JUnit reports, torchrun's error files and the root cause) and a file the rank writes into the
out folder. None of it may survive into the evidence bundle.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest
from _world import fault_rank, rank

TOKEN = os.environ.get("HF_TOKEN", "")


def test_spills_the_token_into_its_output(rank_plan):
    assert TOKEN, "the test that launches this suite plants HF_TOKEN"
    print(f"HF_TOKEN={TOKEN}")
    print(f"stderr: token {TOKEN}", file=sys.stderr)
    logging.getLogger("leaky").warning("using token %s", TOKEN)
    notes = Path(str(rank_plan.out_dir)) / "notes" / f"rank-{rank():02d}.txt"
    notes.parent.mkdir(parents=True, exist_ok=True)
    notes.write_text(f'{{"token": "{TOKEN}"}}\n')


@pytest.mark.parametrize("token", [TOKEN])
def test_carries_the_token_in_its_id(token):
    assert token == TOKEN


def test_fails_with_the_token_in_its_message():
    assert rank() != fault_rank(), f"request refused for HF_TOKEN={TOKEN}"
