"""An honest, passing suite whose text looks like credentials but holds none: parameters named
like secret variables (`MAX_TOKENS=64`), URLs with a user name (`ssh://git@host`), and a test
that checks a child process fails, the child reporting through torchrun's `@record` (which
writes the TORCHELASTIC_ERROR_FILE it inherits, as a nested torchrun's main does)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch.distributed as dist
from _world import all_reduce_sum

CHILD = """
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise RuntimeError("the child fails, as the test expects")

main()
"""


@pytest.mark.parametrize("limit", ["MAX_TOKENS=64", "MAX_TOKENS=128"])
def test_limit(limit):
    assert all_reduce_sum(1.0) == dist.get_world_size()


@pytest.mark.parametrize("remote", ["ssh://git@example.org/a", "ssh://ci@example.org/a"])
def test_remote(remote):
    dist.barrier()


def test_a_child_that_fails_is_reported():
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True)
    assert child.returncode != 0
