"""One rank errors in a fixture (setup, then teardown) while its peer passes the test."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from _world import fault_rank, rank


@pytest.fixture
def setup_breaks_on_the_fault_rank():
    if rank() == fault_rank():
        raise RuntimeError(f"injected setup error on rank {rank()}")
    yield


@pytest.fixture
def teardown_breaks_on_the_fault_rank():
    yield
    if rank() == fault_rank():
        raise RuntimeError(f"injected teardown error on rank {rank()}")


def test_before():
    dist.barrier()


def test_setup_error(setup_breaks_on_the_fault_rank):
    pass


def test_teardown_error(teardown_breaks_on_the_fault_rank):
    pass


def test_after():
    dist.barrier()
