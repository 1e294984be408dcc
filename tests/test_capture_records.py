"""Capture records and events: the fields added for the capture window round-trip, and records
written before them still load."""

from __future__ import annotations

import json

import pytest

from harness.capture.events import LazyEvent, LazySpecializationError
from harness.core.signature import TransportSignature
from harness.schema.capture import CaptureRecord, DetectorStatus, SignatureUse

KIMI = TransportSignature("bf16", 96, 576, 512, 16, max_tokens=8)


def _record() -> CaptureRecord:
    return CaptureRecord(
        test="suites/capture/test_capture.py::test_capture_has_no_lazy_work[kimi-k3]",
        model="kimi-k3",
        rank=3,
        path="cpu-simulated",
        warm_impl="before-kimi",
        signatures=(SignatureUse("kimi-k3", KIMI, warmed=False, used_in_capture=True),),
        events=(
            LazyEvent("transport-registry", 3, "registry miss in get", KIMI, "stack", "warmup"),
            LazyEvent("transport-registry", 3, "transport created", KIMI),
            LazyEvent("transport-buffers", 3, "buffer allocation 'gather_send'", KIMI),
        ),
        negative_control=True,
        expected_detectors=("transport-registry", "transport-buffers"),
        detectors=(
            DetectorStatus("transport-registry", True),
            DetectorStatus("cuda-memory", False, "CUDA is not available"),
        ),
        replays=2,
    )


def test_record_round_trips_through_json() -> None:
    record = _record()
    data = json.loads(json.dumps(record.to_json()))
    assert CaptureRecord.from_json(data) == record
    assert data["by_detector"] == {"transport-buffers": 1, "transport-registry": 2}
    assert data["events"][0]["phase"] == "warmup"
    assert data["detectors"][1] == {
        "name": "cuda-memory",
        "active": False,
        "reason": "CUDA is not available",
    }


def test_record_written_before_the_new_fields_still_loads() -> None:
    data = _record().to_json()
    for key in ("detectors", "replays", "by_detector"):
        del data[key]
    for event in data["events"]:
        del event["phase"]
    record = CaptureRecord.from_json(data)
    assert record.detectors == () and record.replays == 0
    assert {e.phase for e in record.events} == {"capture"}


def test_detected_needs_every_expected_detector() -> None:
    record = _record()
    assert record.detected
    written = {k: v for k, v in record.to_json().items() if k != "by_detector"}
    only_registry = CaptureRecord.from_json({**written, "events": [record.events[0].to_json()]})
    assert not only_registry.detected
    assert only_registry.by_detector == {"transport-registry": 1}


def test_a_control_expecting_no_detector_or_seeing_no_event_is_not_detected() -> None:
    """An empty expectation is no control (every window would pass it), and nothing seen is
    nothing detected."""
    written = {k: v for k, v in _record().to_json().items() if k != "by_detector"}
    assert not CaptureRecord.from_json({**written, "expected_detectors": []}).detected
    assert not CaptureRecord.from_json({**written, "events": []}).detected


def test_a_record_whose_counts_disagree_with_its_events_is_refused() -> None:
    record = _record()
    edited = {**record.to_json(), "events": [record.events[0].to_json()]}
    with pytest.raises(ValueError, match="by_detector"):
        CaptureRecord.from_json(edited)


def test_a_record_with_an_unknown_key_is_refused() -> None:
    with pytest.raises(ValueError, match="unexpected"):
        CaptureRecord.from_json({**_record().to_json(), "lazy": 0})


def test_strict_error_names_the_signature() -> None:
    error = LazySpecializationError(_record().events[0])
    assert "96 heads x 576 -> 512" in str(error)
    assert "rank 3" in str(error) and "transport-registry" in str(error)
