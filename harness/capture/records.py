"""What one capture check on one rank leaves for the evidence bundle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.capture.events import LazyEvent
from harness.warm.signature import TransportSignature


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
        )
