"""Synthetic GPU-smoke results: a run that passed on an H200, and single-fault variants of it.

The smoke itself needs a GPU; its verdict, bundle and command line do not. `passing_result()` is
what a clean run on the lent H200 (sm_90, torch 2.11, CUDA 13, Triton 3.6) would report; each
entry of `FAULTS` breaks exactly one thing the verdict must catch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from harness.capture.events import LazyEvent
from harness.core.signature import TransportSignature
from harness.schema.capture import DetectorStatus, SignatureUse
from harness.schema.smoke import (
    REQUIRED_CONTROLS,
    CaptureOutcome,
    ControlOutcome,
    SmokeMachine,
    SmokeResult,
    SmokeUse,
)

H200 = SmokeMachine(
    torch="2.11.0+cu130",
    cuda="13.0",
    device="cuda:0",
    device_name="NVIDIA H200",
    capability=(9, 0),
    triton="3.6.0",
)
PRODUCTION = TransportSignature(
    dtype="bf16",
    total_heads=96,
    query_head_dim=576,
    output_head_dim=512,
    dcp_world_size=16,
    max_tokens=8,
    device_type="cuda",
)
WORLD1 = dataclasses.replace(PRODUCTION, dcp_world_size=1)
STATUSES = (
    DetectorStatus("transport-registry", True),
    DetectorStatus("cuda-memory", True),
    DetectorStatus("triton-jit", True),
    DetectorStatus("b12x-kernel-resolution", False, "b12x is not importable"),
)


def event(detector: str, phase: str = "capture", what: str = "lazy work") -> LazyEvent:
    return LazyEvent(detector=detector, rank=0, what=what, phase=phase)


def fired(detector: str) -> ControlOutcome:
    return ControlOutcome(
        detector=detector,
        ran=True,
        path="cuda-graph",
        happened=1,
        events=(event(detector),),
        statuses=STATUSES,
        duration_s=0.5,
    )


def passing_result() -> SmokeResult:
    return SmokeResult(
        machine=H200,
        capture=CaptureOutcome(
            model="kimi-k3",
            path="cuda-graph",
            expected_replays=2,
            replays=2,
            statuses=STATUSES,
            signatures=(SignatureUse("kimi-k3", WORLD1, warmed=True, used_in_capture=True),),
            duration_s=1.5,
        ),
        controls=tuple(fired(d) for d in REQUIRED_CONTROLS),
        discovered=(PRODUCTION,),
        warmed=(WORLD1,),
        started_at="2026-12-01T09:00:00+00:00",
        finished_at="2026-12-01T09:00:30+00:00",
        extra=SmokeUse(warm_impl="vendored", transports=("torch:ag_rs",)),
    )


def _capture(**changes: object) -> Callable[[SmokeResult], SmokeResult]:
    return lambda r: dataclasses.replace(r, capture=dataclasses.replace(r.capture, **changes))


def _control(detector: str, **changes: object) -> Callable[[SmokeResult], SmokeResult]:
    def apply(r: SmokeResult) -> SmokeResult:
        controls = tuple(
            dataclasses.replace(c, **changes) if c.detector == detector else c for c in r.controls
        )
        return dataclasses.replace(r, controls=controls)

    return apply


def _drop(detector: str) -> Callable[[SmokeResult], SmokeResult]:
    return lambda r: dataclasses.replace(
        r, controls=tuple(c for c in r.controls if c.detector != detector)
    )


# id -> (fault, words the failure must name)
FAULTS: dict[str, tuple[Callable[[SmokeResult], SmokeResult], str]] = {
    "capture-error": (_capture(error="RuntimeError: capture broke", replays=0), "capture broke"),
    "capture-simulated": (_capture(path="cpu-simulated"), "cpu-simulated"),
    "capture-lazy-event": (_capture(events=(event("cuda-memory"),)), "lazy event"),
    "capture-unwarmed": (
        _capture(signatures=(SignatureUse("kimi-k3", WORLD1, False, True),)),
        "not warmed",
    ),
    "capture-no-transport": (_capture(signatures=()), "no transport"),
    "capture-replays-missing": (_capture(replays=1), "1 of 2 replays"),
    "capture-mismatch": (_capture(mismatches=("seed 11 vs eager: output 0",)), "mismatch"),
    "nothing-discovered": (lambda r: dataclasses.replace(r, discovered=()), "warmup found no"),
    "control-missing": (_drop("triton-jit"), "triton-jit control is missing"),
    "control-not-run": (
        _control("cuda-memory", ran=False, events=(), error="CUDA is not available"),
        "cuda-memory control did not run",
    ),
    "control-simulated": (_control("process-groups", path="cpu-simulated"), "cpu-simulated"),
    "control-no-work": (_control("triton-jit", happened=0), "did no lazy work"),
    "control-fired-in-warmup": (
        _control("cuda-memory", events=(event("cuda-memory", phase="warmup"),)),
        "cuda-memory did not fire",
    ),
    "control-other-detector": (
        _control("transport-registry", events=(event("transport-buffers"),)),
        "transport-registry did not fire",
    ),
}
