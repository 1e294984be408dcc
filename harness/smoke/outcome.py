"""What one GPU smoke saw, as values, and the rule that decides whether it passed.

The smoke passes only when the strict capture of the decode step passed on the real CUDA-graph
path (no lazy event, every replay with fresh inputs matching eager and the reference, every
transport the step used warmed) and every required negative control fired inside a real
capture: its detector reported an event in the capture phase, and the control's own counter,
kept without the detector, shows the lazy work was done. A control that could not run here
(its detector inactive, its library missing) is a failure with its reason, never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.capture.events import LazyEvent
from harness.capture.records import DetectorStatus, SignatureUse
from harness.warm.signature import TransportSignature

CUDA_GRAPH = "cuda-graph"
# The detectors whose negative controls the smoke must see fire, in the order they run.
REQUIRED_CONTROLS: tuple[str, ...] = (
    "cuda-memory",
    "triton-jit",
    "process-groups",
    "transport-registry",
)
CONTROL_WORK: dict[str, str] = {
    "cuda-memory": "a device allocation kept in the default pool during capture",
    "triton-jit": "a Triton kernel first compiled inside the window",
    "process-groups": "a new process group created inside the window",
    "transport-registry": "an unwarmed transport looked up (and about to be created) in capture",
}


@dataclass(frozen=True)
class ControlOutcome:
    """One negative control: did its detector fire inside a real capture?

    `ran` is False when the control could not run here (`error` says why); `happened` is the
    control's own count of the lazy work done inside the window; `error` also holds the
    exception a broken capture raised, which is expected for some lazy work.
    """

    detector: str
    ran: bool
    path: str = ""
    happened: int = 0
    events: tuple[LazyEvent, ...] = ()
    statuses: tuple[DetectorStatus, ...] = ()
    error: str = ""
    duration_s: float = 0.0

    @property
    def fired(self) -> bool:
        return any(e.detector == self.detector and e.phase == "capture" for e in self.events)

    @property
    def seen(self) -> tuple[str, ...]:
        """Every detector that reported something in this window, sorted."""
        return tuple(sorted({e.detector for e in self.events}))

    def problem(self) -> str | None:
        """Why this control does not count as fired, or None when it does."""
        if not self.ran:
            return f"{self.detector} control did not run: {self.error or 'no reason given'}"
        if self.path != CUDA_GRAPH:
            return f"{self.detector} control ran on the {self.path} path, not {CUDA_GRAPH}"
        if self.happened <= 0:
            return f"{self.detector} control did no lazy work (its own counter did not move)"
        if not self.fired:
            return (
                f"{self.detector} did not fire inside the capture although its control did the "
                f"work {self.happened} time(s); detectors that fired: {list(self.seen)}"
            )
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "detector": self.detector,
            "ran": self.ran,
            "path": self.path,
            "happened": self.happened,
            "events": [e.to_json() for e in self.events],
            "statuses": [s.to_json() for s in self.statuses],
            "error": self.error,
            "duration_s": round(self.duration_s, 6),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ControlOutcome:
        return cls(
            detector=data["detector"],
            ran=bool(data["ran"]),
            path=data.get("path", ""),
            happened=int(data.get("happened", 0)),
            events=tuple(LazyEvent.from_json(e) for e in data.get("events", [])),
            statuses=tuple(DetectorStatus.from_json(s) for s in data.get("statuses", [])),
            error=data.get("error", ""),
            duration_s=float(data.get("duration_s", 0.0)),
        )


@dataclass(frozen=True)
class CaptureOutcome:
    """The strict capture of the decode step and its replays.

    `replays` counts replays that ran; `mismatches` names every replay that differed from the
    eager step or from the reference; `error` is set when the capture itself failed.
    """

    model: str
    path: str
    expected_replays: int
    replays: int = 0
    events: tuple[LazyEvent, ...] = ()
    statuses: tuple[DetectorStatus, ...] = ()
    signatures: tuple[SignatureUse, ...] = ()
    mismatches: tuple[str, ...] = ()
    error: str = ""
    duration_s: float = 0.0

    def problems(self) -> list[str]:
        found = []
        if self.error:
            found.append(f"capture of the {self.model} decode step failed: {self.error}")
        if self.path != CUDA_GRAPH:
            found.append(f"capture ran on the {self.path} path, not {CUDA_GRAPH}")
        if self.events:
            first = self.events[0]
            found.append(
                f"{len(self.events)} lazy event(s) during capture, first {first.detector}: "
                f"{first.what}"
            )
        unwarmed = [u for u in self.signatures if u.used_in_capture and not u.warmed]
        if unwarmed:
            named = ", ".join(u.signature.describe() for u in unwarmed)
            found.append(f"the step used transports that were not warmed: {named}")
        if not any(u.used_in_capture for u in self.signatures) and not self.error:
            found.append("the captured step used no transport")
        if not self.error and self.replays < self.expected_replays:
            found.append(f"{self.replays} of {self.expected_replays} replays ran")
        found.extend(f"replay mismatch: {m}" for m in self.mismatches)
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "path": self.path,
            "expected_replays": self.expected_replays,
            "replays": self.replays,
            "events": [e.to_json() for e in self.events],
            "statuses": [s.to_json() for s in self.statuses],
            "signatures": [s.to_json() for s in self.signatures],
            "mismatches": list(self.mismatches),
            "error": self.error,
            "duration_s": round(self.duration_s, 6),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaptureOutcome:
        return cls(
            model=data["model"],
            path=data["path"],
            expected_replays=int(data["expected_replays"]),
            replays=int(data.get("replays", 0)),
            events=tuple(LazyEvent.from_json(e) for e in data.get("events", [])),
            statuses=tuple(DetectorStatus.from_json(s) for s in data.get("statuses", [])),
            signatures=tuple(SignatureUse.from_json(s) for s in data.get("signatures", [])),
            mismatches=tuple(data.get("mismatches", [])),
            error=data.get("error", ""),
            duration_s=float(data.get("duration_s", 0.0)),
        )


@dataclass(frozen=True)
class Machine:
    """The device and software the smoke ran on (the torch version is whatever is installed)."""

    torch: str
    cuda: str | None
    device: str
    device_name: str
    capability: tuple[int, int] | None = None
    triton: str | None = None
    b12x: str | None = None
    backend: str = "nccl"

    @property
    def sm(self) -> str:
        return "none" if self.capability is None else f"sm_{self.capability[0]}{self.capability[1]}"

    def to_json(self) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "cuda": self.cuda,
            "device": self.device,
            "device_name": self.device_name,
            "capability": None if self.capability is None else list(self.capability),
            "sm": self.sm,
            "triton": self.triton,
            "b12x": self.b12x,
            "backend": self.backend,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Machine:
        cap = data.get("capability")
        return cls(
            torch=data["torch"],
            cuda=data.get("cuda"),
            device=data["device"],
            device_name=data["device_name"],
            capability=None if cap is None else (int(cap[0]), int(cap[1])),
            triton=data.get("triton"),
            b12x=data.get("b12x"),
            backend=data.get("backend", "nccl"),
        )


@dataclass(frozen=True)
class SmokeResult:
    """Everything one smoke run saw; `failures` is the verdict (empty means pass)."""

    machine: Machine
    capture: CaptureOutcome
    controls: tuple[ControlOutcome, ...]
    discovered: tuple[TransportSignature, ...] = ()  # vendored discovery at TP16/DCP16
    warmed: tuple[TransportSignature, ...] = ()  # their world-1 projections, created
    started_at: str = ""
    finished_at: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def control(self, detector: str) -> ControlOutcome | None:
        return next((c for c in self.controls if c.detector == detector), None)

    def capture_problems(self) -> list[str]:
        """Why the capture check failed (the capture itself, or warmup found nothing)."""
        found = self.capture.problems()
        if not self.discovered:
            found.append("warmup found no transport signature in the stand-in model")
        return found

    def control_problem(self, detector: str) -> str | None:
        """Why `detector`'s control does not count as fired (missing included), or None."""
        outcome = self.control(detector)
        if outcome is None:
            return f"{detector} control is missing from the run"
        return outcome.problem()

    @property
    def failures(self) -> list[str]:
        found = self.capture_problems()
        for detector in REQUIRED_CONTROLS:
            problem = self.control_problem(detector)
            if problem:
                found.append(problem)
        return found

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine.to_json(),
            "capture": self.capture.to_json(),
            "controls": [c.to_json() for c in self.controls],
            "discovered": [s.to_json() for s in self.discovered],
            "warmed": [s.to_json() for s in self.warmed],
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "extra": self.extra,
            "failures": self.failures,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SmokeResult:
        return cls(
            machine=Machine.from_json(data["machine"]),
            capture=CaptureOutcome.from_json(data["capture"]),
            controls=tuple(ControlOutcome.from_json(c) for c in data.get("controls", [])),
            discovered=tuple(TransportSignature.from_json(s) for s in data.get("discovered", [])),
            warmed=tuple(TransportSignature.from_json(s) for s in data.get("warmed", [])),
            started_at=data.get("started_at", ""),
            finished_at=data.get("finished_at", ""),
            extra=dict(data.get("extra", {})),
        )
