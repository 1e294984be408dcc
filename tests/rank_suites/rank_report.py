"""What a reader of summary.md must see at once: skips by reason, a test every rank fails the
same way, and a test left unrun when --maxfail 1 stops the run."""

from __future__ import annotations

import pytest
from _world import all_reduce_sum, rank


def test_passes():
    assert all_reduce_sum(1.0) >= 1.0


@pytest.mark.parametrize("n", [1, 2, 3])
def test_needs_the_target_world(n):
    pytest.skip("needs 16 ranks")


def test_needs_a_gpu():
    pytest.skip("needs a CUDA GPU")


def test_every_rank_fails_alike():
    all_reduce_sum(1.0)
    assert rank() < 0, "the same assertion on every rank"


def test_left_unrun():
    pass
