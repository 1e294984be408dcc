"""The receipt schema validates where values are born, and round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest
from _support.evidence_factory import passing_run
from pydantic import ValidationError

from harness.evidence.writer import finalize_bundle
from harness.schema.image import Image
from harness.schema.receipt import (
    Capture,
    CaptureEvent,
    Geometry,
    NegativeControl,
    Ranks,
    Receipt,
    Tally,
)


def test_geometry_checks_its_numbers() -> None:
    Geometry(world_size=16, nnodes=2, nproc_per_node=8, backend="nccl", tp=16, dcp=4)
    with pytest.raises(ValidationError, match="world_size=16 != nnodes=1 x nproc_per_node=8"):
        Geometry(world_size=16, nnodes=1, nproc_per_node=8, backend="gloo", tp=16, dcp=16)
    with pytest.raises(ValidationError, match="dcp=3 does not divide tp=16"):
        Geometry(world_size=16, nnodes=1, nproc_per_node=16, backend="gloo", tp=16, dcp=3)
    with pytest.raises(ValidationError):
        Geometry(world_size=16, nnodes=1, nproc_per_node=16, backend="mpi", tp=16, dcp=16)


def test_capture_counts_must_add_up() -> None:
    event = CaptureEvent(rank=1, test="t", detector="jit", what="compiled")
    Capture(lazy_events=1, by_detector={"jit": 1}, per_rank={0: 0, 1: 1}, events=[event])
    with pytest.raises(ValidationError, match="by_detector adds up to 0"):
        Capture(lazy_events=1, by_detector={}, per_rank={1: 1}, events=[event])
    with pytest.raises(ValidationError, match="windows=2 but paths add up to 1"):
        Capture(lazy_events=0, by_detector={}, per_rank={}, windows=2, paths={"cuda-graph": 1})


def test_negative_control_and_ranks_counts() -> None:
    with pytest.raises(ValidationError, match="detected=3 > expected=2"):
        NegativeControl(expected=2, detected=3, lazy_events=0)
    with pytest.raises(ValidationError, match="missed"):
        NegativeControl(expected=2, detected=1, lazy_events=1)
    with pytest.raises(ValidationError, match="killed"):
        Ranks(expected=4, reported=4, complete=3, killed=[])
    with pytest.raises(ValidationError, match="complete <= reported <= expected"):
        Ranks(expected=4, reported=5, complete=4)
    with pytest.raises(ValidationError, match=r"stopped ranks \[2\] are not all killed \[3\]"):
        Ranks(expected=4, reported=4, complete=3, killed=[3], stopped=[2])


def test_image_digest_must_be_a_sha256_digest() -> None:
    Image(reference="x", digest="sha256:" + "0" * 64, labels={"kept": "unknown keys survive"})
    with pytest.raises(ValidationError):
        Image(reference="x", digest="latest")


def test_tally_rejects_negative_counts_and_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        Tally(passed=-1)
    with pytest.raises(ValidationError):
        Tally.model_validate({"passed": 1, "xpassed": 2})


def test_receipt_round_trips_and_rejects_bad_file_digests(tmp_path: Path) -> None:
    out = tmp_path / "b"
    receipt = finalize_bundle(out, passing_run(out, world=2))
    data = receipt.to_json()
    assert data["schema"] == "dcpqual-receipt/v1"
    assert Receipt.from_json(data) == receipt
    assert Receipt.model_validate_json(receipt.dumps()) == receipt
    data["files"] = {"records/rank-00.json": "not-a-digest"}
    with pytest.raises(ValidationError, match="not sha256 hex digests"):
        Receipt.from_json(data)
    with pytest.raises(ValidationError):
        receipt.verdict = "fail"  # type: ignore[misc]  # frozen
