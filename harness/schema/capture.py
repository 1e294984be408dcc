"""What one capture check on one rank leaves in its rank record, as validated values.

Pydantic dataclasses: built positionally like the frozen dataclasses they replace, refused with
a `ValidationError` (a `ValueError`) when a field has the wrong type or an unknown key, and
described by the rank record's JSON Schema. Derived values (`by_detector`) are written for
readers and recomputed, never trusted, when a record is read back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import ConfigDict, Field, NonNegativeInt, model_validator
from pydantic.dataclasses import dataclass

from harness.schema.base import JsonValue, derived_field
from harness.schema.signature import SignatureField

STRICT = ConfigDict(extra="forbid")
# Strings to the code that builds them, checked whole on validation (and in the JSON Schema).
Phase = Annotated[str, Field(pattern=r"^(warmup|capture)$")]
CapturePath = Annotated[str, Field(pattern=r"^(cuda-graph|cpu-simulated)$")]


def per_detector(names: Iterable[object]) -> dict[str, int]:
    """How many events each detector reported, by name (sorted); non-names are not counted."""
    return dict(sorted(Counter(n for n in names if isinstance(n, str)).items()))


def derived(data: dict[str, Any], name: str, value: object, what: str) -> dict[str, Any]:
    """`data` without the derived key `name`, which must equal `value` when present."""
    if name in data:
        if data[name] != value:
            raise ValueError(f"{what}: {name}={data[name]!r} but the fields give {value!r}")
        data = {k: v for k, v in data.items() if k != name}
    return data


@dataclass(frozen=True, config=STRICT)
class LazyEvent(JsonValue):
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


# The dynamo detector's status where it cannot see dynamo's import (`DynamoDetector.blind_spots`).
IMPORT_BLIND = "dynamo-import"
# Statuses a window adds only where a running detector is blind to part of its work: listed
# inactive where they apply and absent elsewhere, so their absence is no missing detector.
BLIND_SPOTS: frozenset[str] = frozenset({IMPORT_BLIND})


@dataclass(frozen=True, config=STRICT)
class DetectorStatus(JsonValue):
    """Whether one detector watched a window on this machine, and if not, why.

    A detector that cannot run here (no CUDA for `cuda-memory`, Triton or b12x not importable)
    is listed with its reason instead of silently passing; the evidence turns these reasons into
    `limitations`.
    """

    name: str
    active: bool
    reason: str = ""


@dataclass(frozen=True, config=STRICT)
class SignatureUse(JsonValue):
    """A transport signature of a model: was it warmed, and did the captured step use it?"""

    model: str
    signature: SignatureField
    warmed: bool
    used_in_capture: bool


@dataclass(frozen=True, config=STRICT)
class CaptureRecord(JsonValue):
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

    @derived_field
    def by_detector(self) -> dict[str, int]:
        """Lazy events per detector name (sorted), for the receipt's `capture.by_detector`."""
        return per_detector(e.detector for e in self.events)

    @property
    def detected(self) -> bool:
        """For a negative control: did every expected detector report at least one event?"""
        seen = {e.detector for e in self.events}
        return bool(self.expected_detectors) and set(self.expected_detectors) <= seen

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        """A written record carries `by_detector`; it must be what its events give."""
        if isinstance(data, dict) and "by_detector" in data:
            names = (
                e.get("detector") if isinstance(e, dict) else getattr(e, "detector", None)
                for e in data.get("events", ())
            )
            data = derived(data, "by_detector", per_detector(names), "capture")
        return data
