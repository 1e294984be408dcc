"""Lazy work seen inside a capture window, as values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.core.signature import TransportSignature


@dataclass(frozen=True)
class LazyEvent:
    """One piece of lazy specialization a detector saw while a capture window was open.

    `detector` is the detector's registered name (e.g. "transport-registry"), `what` a short
    description ("created transport 96 heads x 576 -> 512 ..."), `stack` a few frames of where it
    happened, so a reviewer can find the code that did it. `phase` says whether it happened in the
    window's warm-up iterations ("warmup") or in the capture itself ("capture").
    """

    detector: str
    rank: int
    what: str
    signature: TransportSignature | None = None
    stack: str = ""
    phase: str = "capture"

    def to_json(self) -> dict[str, Any]:
        return {
            "detector": self.detector,
            "rank": self.rank,
            "what": self.what,
            "signature": None if self.signature is None else self.signature.to_json(),
            "stack": self.stack,
            "phase": self.phase,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LazyEvent:
        sig = data.get("signature")
        return cls(
            detector=data["detector"],
            rank=int(data["rank"]),
            what=data["what"],
            signature=None if sig is None else TransportSignature.from_json(sig),
            stack=data.get("stack", ""),
            phase=data.get("phase", "capture"),
        )


class LazySpecializationError(RuntimeError):
    """Raised in strict mode at the first lazy event inside a capture window."""

    def __init__(self, event: LazyEvent) -> None:
        self.event = event
        where = f" [{event.signature.describe()}]" if event.signature else ""
        super().__init__(
            f"lazy specialization during capture on rank {event.rank}: "
            f"{event.detector}: {event.what}{where}"
        )
