"""Lazy work seen inside a capture window, as values."""

from __future__ import annotations

from harness.schema.capture import LazyEvent

__all__ = ["LazyEvent", "LazySpecializationError"]


class LazySpecializationError(RuntimeError):
    """Raised in strict mode at the first lazy event inside a capture window."""

    def __init__(self, event: LazyEvent) -> None:
        self.event = event
        where = f" [{event.signature.describe()}]" if event.signature else ""
        super().__init__(
            f"lazy specialization during capture on rank {event.rank}: "
            f"{event.detector}: {event.what}{where}"
        )
