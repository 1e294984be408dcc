"""Each rank leaves two files open with their last bytes still in the buffer, as a careless test
does: one the module opened as it was collected (frozen with the rank's heap), one a test opened
and kept. A cold interpreter writes both as it exits; so must the rank's fast exit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

import torch.distributed as dist

FOLDER = Path(os.environ["DCPQUAL_LEFT_OPEN_DIR"])
RANK = os.environ["RANK"]
AT_COLLECTION = (FOLDER / f"collected-{RANK}").open("w")  # left open on purpose
KEPT: list[TextIO] = []


def test_leaves_its_files_open() -> None:
    AT_COLLECTION.write(f"rank {RANK}, opened at collection")
    in_test = (FOLDER / f"in-test-{RANK}").open("w")  # left open on purpose
    in_test.write(f"rank {RANK}, opened in the test")
    KEPT.append(in_test)
    dist.barrier()
