"""The fault rank fails two tests outside any collective; a barrier between them shows the ranks
still move in lockstep when the run goes on after a failure (`--maxfail 2`)."""

from __future__ import annotations

import torch.distributed as dist
from _world import fault_rank, rank


def test_first_fault():
    assert rank() != fault_rank(), f"first injected failure on rank {rank()}"


def test_in_between():
    dist.barrier()


def test_second_fault():
    assert rank() != fault_rank(), f"second injected failure on rank {rank()}"


def test_never_reached_at_maxfail_2():
    dist.barrier()
