"""What `dcpqual compare --json` prints and `dcpqual nightly` writes, as validated values.

Pydantic dataclasses: built positionally by the comparison, refused with a `ValidationError`
when a field has the wrong type or an unknown key, and described by the committed JSON Schemas
(`compare`, `nightly`). Derived values (`change`, `regressed`, `exit_code`) are written for
readers and recomputed from the fields, never stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Literal

from pydantic import ConfigDict, NonNegativeInt, model_validator
from pydantic.dataclasses import dataclass

from harness.schema.base import JsonValue, checked_derived, derived_field

COMPARE_SCHEMA: Final = "dcpqual-compare/v1"
NIGHTLY_SCHEMA: Final = "dcpqual-nightly/v1"
STRICT = ConfigDict(extra="forbid")

SignatureChange = Literal["new", "gone", "changed", "same"]


@dataclass(frozen=True, config=STRICT)
class Change(JsonValue):
    """One identity field that differs; None means absent on that side."""

    field: str
    base: str | None
    head: str | None


@dataclass(frozen=True, config=STRICT)
class Count(JsonValue):
    """A count on both sides, e.g. lazy events of one detector and signature."""

    detector: str
    signature: str
    base: NonNegativeInt
    head: NonNegativeInt


@dataclass(frozen=True, config=STRICT)
class SignatureUse(JsonValue):
    warmed: bool
    used_in_capture: bool

    @property
    def lazy(self) -> bool:
        """Used by the captured step but not created by warmup: created lazily in capture."""
        return self.used_in_capture and not self.warmed


@dataclass(frozen=True, config=STRICT)
class SignatureDelta(JsonValue):
    model: str
    signature: str  # TransportSignature.describe() form, as lazy events name it
    base: SignatureUse | None
    head: SignatureUse | None

    @derived_field
    def change(self) -> SignatureChange:
        if self.base is None:
            return "new"
        if self.head is None:
            return "gone"
        return "same" if self.base == self.head else "changed"

    @model_validator(mode="wrap")
    @classmethod
    def _derived(cls, data: Any, handler: Any) -> Any:
        return checked_derived(data, handler, "change", "signature delta")


@dataclass(frozen=True, config=STRICT)
class SuiteCounts(JsonValue):
    """A suite's tally as the comparison shows it (the receipt's `Tally` without rank_cases)."""

    passed: NonNegativeInt
    failed: NonNegativeInt
    skipped: NonNegativeInt
    errors: NonNegativeInt


@dataclass(frozen=True, config=STRICT)
class SuiteDelta(JsonValue):
    name: str
    base: SuiteCounts | None
    head: SuiteCounts | None


@dataclass(frozen=True, config=STRICT)
class Side(JsonValue):
    """What identifies one side of the comparison at a glance."""

    path: str
    receipt_sha256: str
    sums_sha256: str
    verdict: str
    status: str
    warm_impl: str
    geometry: str
    root_cause: str | None


@dataclass(frozen=True, config=STRICT)
class Comparison(JsonValue):
    """Two receipts side by side: what differs, and which differences are regressions."""

    base: Side
    head: Side
    signatures: tuple[SignatureDelta, ...]
    lazy_events: tuple[Count, ...]
    suites: tuple[SuiteDelta, ...]
    identity: tuple[Change, ...]
    regressions: tuple[str, ...]
    improvements: tuple[str, ...]
    notes: tuple[str, ...]
    schema: Literal["dcpqual-compare/v1"] = COMPARE_SCHEMA

    @derived_field
    def regressed(self) -> bool:
        return bool(self.regressions)

    @model_validator(mode="wrap")
    @classmethod
    def _derived(cls, data: Any, handler: Any) -> Any:
        return checked_derived(data, handler, "regressed", "comparison")

    @property
    def exit_code(self) -> int:
        return 1 if self.regressed else 0


@dataclass(frozen=True, config=STRICT)
class NightlyResult(JsonValue):
    """One night: the archive, the bundle it added (None: no step left one), the baseline it was
    compared with, each step's exit code, and why the night failed (one line each)."""

    archive: Path
    bundle: Path | None
    previous: Path | None
    step_exit_codes: tuple[int, ...]
    problems: tuple[str, ...]
    verdict: str | None = None
    comparison: Comparison | None = None
    skipped_previous: tuple[str, ...] = ()  # earlier bundles passed over, and why
    schema: Literal["dcpqual-nightly/v1"] = NIGHTLY_SCHEMA

    @property
    def ran(self) -> bool:
        return self.bundle is not None

    @derived_field
    def exit_code(self) -> int:
        if self.bundle is None:
            failed = [c for c in self.step_exit_codes if c]
            return failed[-1] if failed else 2
        return 1 if self.problems else 0

    @model_validator(mode="wrap")
    @classmethod
    def _derived(cls, data: Any, handler: Any) -> Any:
        return checked_derived(data, handler, "exit_code", "nightly result")
