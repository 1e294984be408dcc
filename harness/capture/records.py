"""What one capture check on one rank leaves for the evidence bundle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.capture.events import LazyEvent
from harness.core.signature import TransportSignature


@dataclass(frozen=True)
class DetectorStatus:
    """Whether one detector watched a window on this machine, and if not, why.

    A detector that cannot run here (no CUDA for `cuda-memory`, Triton or b12x not importable)
    is listed with its reason instead of silently passing; the evidence turns these reasons into
    `limitations`.
    """

    name: str
    active: bool
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "active": self.active, "reason": self.reason}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DetectorStatus:
        return cls(name=data["name"], active=bool(data["active"]), reason=data.get("reason", ""))


@dataclass(frozen=True)
class SignatureUse:
    """A transport signature of a model: was it warmed, and did the captured step use it?"""

    model: str
    signature: TransportSignature
    warmed: bool
    used_in_capture: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "signature": self.signature.to_json(),
            "warmed": self.warmed,
            "used_in_capture": self.used_in_capture,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SignatureUse:
        return cls(
            model=data["model"],
            signature=TransportSignature.from_json(data["signature"]),
            warmed=bool(data["warmed"]),
            used_in_capture=bool(data["used_in_capture"]),
        )


@dataclass(frozen=True)
class CaptureRecord:
    """One capture window run by a suite test on one rank.

    `negative_control` marks windows where lazy work was provoked on purpose; their events are
    expected (`expected_detectors`) and are reported apart from the real capture checks.
    `path` says which capture ran: "cuda-graph" (real torch.cuda.graph) or "cpu-simulated".
    `detectors` lists every detector of the window, active or not (with the reason it could not
    run here); `replays` counts the replays with fresh inputs that matched the eager results.
    """

    test: str
    model: str
    rank: int
    path: str
    warm_impl: str
    signatures: tuple[SignatureUse, ...] = ()
    events: tuple[LazyEvent, ...] = ()
    negative_control: bool = False
    expected_detectors: tuple[str, ...] = field(default=())
    detectors: tuple[DetectorStatus, ...] = ()
    replays: int = 0

    @property
    def by_detector(self) -> dict[str, int]:
        """Lazy events per detector name (sorted), for the receipt's `capture.by_detector`."""
        counts: dict[str, int] = {}
        for event in self.events:
            counts[event.detector] = counts.get(event.detector, 0) + 1
        return dict(sorted(counts.items()))

    @property
    def detected(self) -> bool:
        """For a negative control: did every expected detector report at least one event?"""
        seen = {e.detector for e in self.events}
        return bool(self.expected_detectors) and set(self.expected_detectors) <= seen

    def to_json(self) -> dict[str, Any]:
        return {
            "test": self.test,
            "model": self.model,
            "rank": self.rank,
            "path": self.path,
            "warm_impl": self.warm_impl,
            "signatures": [s.to_json() for s in self.signatures],
            "events": [e.to_json() for e in self.events],
            "negative_control": self.negative_control,
            "expected_detectors": list(self.expected_detectors),
            "detectors": [d.to_json() for d in self.detectors],
            "replays": self.replays,
            "by_detector": self.by_detector,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaptureRecord:
        return cls(
            test=data["test"],
            model=data["model"],
            rank=int(data["rank"]),
            path=data["path"],
            warm_impl=data["warm_impl"],
            signatures=tuple(SignatureUse.from_json(s) for s in data.get("signatures", [])),
            events=tuple(LazyEvent.from_json(e) for e in data.get("events", [])),
            negative_control=bool(data.get("negative_control", False)),
            expected_detectors=tuple(data.get("expected_detectors", [])),
            detectors=tuple(DetectorStatus.from_json(d) for d in data.get("detectors", [])),
            replays=int(data.get("replays", 0)),
        )
