"""ParallelGeometry validates tp/dcp/heads/world size and names the offending numbers."""

from __future__ import annotations

import pytest

from harness.errors import GeometryError
from harness.warm.geometry import ParallelGeometry


@pytest.mark.parametrize("tp, dcp", [(16, 16), (16, 4), (8, 8), (16, 1), (1, 1)])
def test_valid_geometries(tp, dcp):
    assert ParallelGeometry(tp, dcp).tp == tp


@pytest.mark.parametrize(
    "tp, dcp, message",
    [
        (16, 5, "dcp=5 does not divide tp=16"),
        (0, 1, "tp must be a positive integer, got 0"),
        (16, -4, "dcp must be a positive integer, got -4"),
        (4, 8, "dcp=8 does not divide tp=4"),
    ],
)
def test_invalid_geometries(tp, dcp, message):
    with pytest.raises(GeometryError, match=message):
        ParallelGeometry(tp, dcp)


def test_heads_must_split_over_tp():
    assert ParallelGeometry(16, 16).local_heads(96) == 6
    with pytest.raises(GeometryError, match="96 attention heads, not divisible by tp=64"):
        ParallelGeometry(64, 4).local_heads(96, model="kimi-k3")


def test_world_size_must_hold_whole_tp_groups():
    ParallelGeometry(16, 16).check_world_size(32)
    with pytest.raises(GeometryError, match="world size 8 cannot host tp=16"):
        ParallelGeometry(16, 16).check_world_size(8)
