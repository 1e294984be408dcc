"""What one capture check on one rank leaves in its rank record, as validated values.

Pydantic dataclasses: built positionally like the frozen dataclasses they replace, refused with
a `ValidationError` (a `ValueError`) when a field has the wrong type or an unknown key, and
described by the rank record's JSON Schema. Derived values (`by_detector`) are written for
readers and recomputed, never trusted, when a record is read back.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    ConfigDict,
    Field,
    NonNegativeInt,
    TypeAdapter,
    computed_field,
    model_validator,
)
from pydantic.dataclasses import dataclass

from harness.schema.signature import SignatureField

STRICT = ConfigDict(extra="forbid")
# Strings to the code that builds them, checked whole on validation (and in the JSON Schema).
Phase = Annotated[str, Field(pattern=r"^(warmup|capture)$")]
CapturePath = Annotated[str, Field(pattern=r"^(cuda-graph|cpu-simulated)$")]


def derived(data: dict[str, Any], name: str, value: object, what: str) -> dict[str, Any]:
    """`data` without the derived key `name`, which must equal `value` when present."""
    if name in data:
        if data[name] != value:
            raise ValueError(f"{what}: {name}={data[name]!r} but the fields give {value!r}")
        data = {k: v for k, v in data.items() if k != name}
    return data


@dataclass(frozen=True, config=STRICT)
class LazyEvent:
    """One piece of lazy specialization a detector saw while a capture window was open.

    `detector` is the detector's registered name (e.g. "transport-registry"), `what` a short
    description ("created transport 96 heads x 576 -> 512 ..."), `stack` a few frames of where it
    happened, so a reviewer can find the code that did it. `phase` says whether it happened in the
    window's warm-up iterations ("warmup") or in the capture itself ("capture").
    """

    detector: str
    rank: NonNegativeInt
    what: str
    signature: SignatureField | None = None
    stack: str = ""
    phase: Phase = "capture"

    def to_json(self) -> dict[str, Any]:
        return dict(_EVENT.dump_python(self, mode="json"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LazyEvent:
        return _EVENT.validate_python(data)


@dataclass(frozen=True, config=STRICT)
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
        return dict(_STATUS.dump_python(self, mode="json"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DetectorStatus:
        return _STATUS.validate_python(data)


@dataclass(frozen=True, config=STRICT)
class SignatureUse:
    """A transport signature of a model: was it warmed, and did the captured step use it?"""

    model: str
    signature: SignatureField
    warmed: bool
    used_in_capture: bool

    def to_json(self) -> dict[str, Any]:
        return dict(_USE.dump_python(self, mode="json"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SignatureUse:
        return _USE.validate_python(data)


@dataclass(frozen=True, config=STRICT)
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
    rank: NonNegativeInt
    path: CapturePath
    warm_impl: str
    signatures: tuple[SignatureUse, ...] = ()
    events: tuple[LazyEvent, ...] = ()
    negative_control: bool = False
    expected_detectors: tuple[str, ...] = ()
    detectors: tuple[DetectorStatus, ...] = ()
    replays: NonNegativeInt = 0

    @computed_field  # type: ignore[prop-decorator]
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
        return dict(_CAPTURE.dump_python(self, mode="json"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaptureRecord:
        return _CAPTURE.validate_python(data)

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        """A written record carries `by_detector`; it must be what its events give."""
        if isinstance(data, dict) and "by_detector" in data:
            counts: dict[str, int] = {}
            for event in data.get("events", ()):
                name = (
                    event.get("detector")
                    if isinstance(event, dict)
                    else getattr(event, "detector", None)
                )
                if isinstance(name, str):
                    counts[name] = counts.get(name, 0) + 1
            data = derived(data, "by_detector", dict(sorted(counts.items())), "capture")
        return data


_EVENT = TypeAdapter(LazyEvent)
_STATUS = TypeAdapter(DetectorStatus)
_USE = TypeAdapter(SignatureUse)
_CAPTURE = TypeAdapter(CaptureRecord)
