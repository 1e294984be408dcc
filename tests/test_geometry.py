"""ParallelGeometry validates tp/dcp/heads/world size and names the offending numbers."""

from __future__ import annotations

import pytest

from harness.core.geometry import ParallelGeometry
from harness.errors import GeometryError


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


def test_heads_split_over_tp_with_tail_padding():
    assert ParallelGeometry(16, 16).local_heads(96) == 6
    with pytest.raises(GeometryError, match=r"96 attention heads: at tp=64 .*only padding"):
        ParallelGeometry(64, 4).local_heads(96, model="kimi-k3")


@pytest.mark.parametrize(
    ("heads", "tp", "local", "padded", "last_real"),
    [
        (96, 9, 11, 99, 8),  # Kimi-K3 TP9/DCP9 in production: 11 local, 99 gathered
        (96, 10, 10, 100, 6),
        (96, 12, 8, 96, 8),
        (96, 16, 6, 96, 6),
        (128, 9, 15, 135, 8),
        (128, 10, 13, 130, 11),
        (128, 12, 11, 132, 7),
    ],
)
def test_padded_heads(heads, tp, local, padded, last_real):
    geometry = ParallelGeometry(tp, tp)
    assert geometry.local_heads(heads) == local
    assert geometry.padded_heads(heads) == padded
    real = [geometry.real_local_heads(heads, r) for r in range(tp)]
    assert real[:-1] == [local] * (tp - 1) and real[-1] == last_real
    assert sum(real) == heads  # the padding is exactly the tail
    with pytest.raises(GeometryError, match="outside tp"):
        geometry.real_local_heads(heads, tp)


def test_world_size_must_hold_whole_tp_groups():
    ParallelGeometry(16, 16).check_world_size(32)
    with pytest.raises(GeometryError, match="world size 8 cannot host tp=16"):
        ParallelGeometry(16, 16).check_world_size(8)
