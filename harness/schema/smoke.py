"""The one-GPU smoke's result (`smoke/result.json`, schema "dcpqual-smoke-result/v1") as values,
and the rule that decides whether the smoke passed.

The smoke passes only when the strict capture of the decode step passed on the real CUDA-graph
path (no lazy event, every replay with fresh inputs matching eager and the reference, every
transport the step used warmed) and every required negative control fired inside a real
capture: its detector reported an event in the capture phase, and the control's own counter,
kept without the detector, shows the lazy work was done. A control that could not run here
(its detector inactive, its library missing) is a failure with its reason, never a pass.

The machine is the receipt's own `SmokeMachine`; `failures` is written for readers and, when a
result is read back, must be what the rule gives. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import Field, NonNegativeInt, field_validator, model_validator
from pydantic.dataclasses import dataclass

from harness.schema.base import JsonValue, Model, checked_derived, derived_field
from harness.schema.capture import STRICT, DetectorStatus, LazyEvent, SignatureUse, derived
from harness.schema.rank_record import TestOutcome
from harness.schema.signature import SignatureField

SMOKE_RESULT_SCHEMA: Final = "dcpqual-smoke-result/v1"
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


# The smoke's checks as the tests of its one rank record (`smoke_tests`): the stand-in model it
# captures, and the suite file its checks are named under.
SMOKE_MODEL: Final = "kimi-k3"
SUITE_FILE: Final = "smoke/gpu_smoke.py"
CAPTURE_TEST: Final = f"{SUITE_FILE}::test_capture[{SMOKE_MODEL}]"


def control_test(detector: str) -> str:
    return f"{SUITE_FILE}::test_control[{detector}]"


def sm_of(capability: tuple[int, int] | None) -> str:
    """The device's SM name ("sm_90"), or "none" without a CUDA device."""
    return "none" if capability is None else f"sm_{capability[0]}{capability[1]}"


# The device and software the smoke ran on (torch is whatever is installed); `sm` is derived
# from `capability`: filled in when absent, refused when it disagrees. (Receipt models keep
# their docstrings: they are descriptions in the committed receipt schema.)
class SmokeMachine(Model):
    torch: str
    cuda: str | None = None
    device: str
    device_name: str
    capability: tuple[int, int] | None = None
    sm: str = "none"
    triton: str | None = None
    b12x: str | None = None
    backend: str = "nccl"

    @model_validator(mode="before")
    @classmethod
    def _sm(cls, data: Any) -> Any:
        if isinstance(data, dict):
            cap = data.get("capability")
            try:
                sm = sm_of(None if cap is None else (int(cap[0]), int(cap[1])))
            except (TypeError, ValueError, IndexError):
                return data  # the field validation names what is wrong with it
            data = {**derived(data, "sm", sm, "machine"), "sm": sm}
        return data


class Smoke(Model):
    """The one-GPU smoke's machine and its failures (`dcpqual gpu-smoke`)."""

    machine: SmokeMachine
    failures: list[str] = Field(default_factory=list)


def _rounded(value: float) -> float:
    return round(value, 6)


@dataclass(frozen=True, config=STRICT)
class ControlOutcome(JsonValue):
    """One negative control: did its detector fire inside a real capture?

    `ran` is False when the control could not run here (`error` says why); `happened` is the
    control's own count of the lazy work done inside the window; `error` also holds the
    exception a broken capture raised, which is expected for some lazy work.
    """

    detector: str
    ran: bool
    path: str = ""
    happened: NonNegativeInt = 0
    events: tuple[LazyEvent, ...] = ()
    statuses: tuple[DetectorStatus, ...] = ()
    error: str = ""
    duration_s: float = 0.0

    _duration = field_validator("duration_s")(_rounded)

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


@dataclass(frozen=True, config=STRICT)
class CaptureOutcome(JsonValue):
    """The strict capture of the decode step and its replays.

    `replays` counts replays that ran; `mismatches` names every replay that differed from the
    eager step or from the reference; `error` is set when the capture itself failed.
    """

    model: str
    path: str
    expected_replays: NonNegativeInt
    replays: NonNegativeInt = 0
    events: tuple[LazyEvent, ...] = ()
    statuses: tuple[DetectorStatus, ...] = ()
    signatures: tuple[SignatureUse, ...] = ()
    mismatches: tuple[str, ...] = ()
    error: str = ""
    duration_s: float = 0.0

    _duration = field_validator("duration_s")(_rounded)

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


@dataclass(frozen=True, config=STRICT)
class SmokeUse(JsonValue):
    """What the smoke ran with and used: the warm implementation and the transport backends it
    created ("torch:ag_rs", "b12x")."""

    warm_impl: str = "vendored"
    transports: tuple[str, ...] = ()


@dataclass(frozen=True, config=STRICT)
class SmokeResult(JsonValue):
    """Everything one smoke run saw; `failures` is the verdict (empty means pass)."""

    machine: SmokeMachine
    capture: CaptureOutcome
    controls: tuple[ControlOutcome, ...]
    discovered: tuple[SignatureField, ...] = ()  # vendored discovery at TP16/DCP16
    warmed: tuple[SignatureField, ...] = ()  # their world-1 projections, created
    started_at: str = ""
    finished_at: str = ""
    extra: SmokeUse = Field(default_factory=SmokeUse)
    schema: Literal["dcpqual-smoke-result/v1"] = SMOKE_RESULT_SCHEMA

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

    @derived_field
    def failures(self) -> list[str]:
        """Every reason the smoke failed: the capture's, then each required control's."""
        found = self.capture_problems()
        for detector in REQUIRED_CONTROLS:
            problem = self.control_problem(detector)
            if problem:
                found.append(problem)
        return found

    @property
    def passed(self) -> bool:
        return not self.failures

    @model_validator(mode="wrap")
    @classmethod
    def _claimed_failures(cls, data: Any, handler: Any) -> Any:
        """A written result carries `failures`; they must be what its values give."""
        return checked_derived(data, handler, "failures", "smoke result")


def smoke_tests(result: SmokeResult) -> tuple[TestOutcome, ...]:
    """One outcome per check, in run order; failed ones carry every reason. The smoke's rank
    record holds exactly these (verify holds it to them)."""
    tests = [_outcome(CAPTURE_TEST, result.capture_problems(), result.capture.duration_s)]
    for detector in REQUIRED_CONTROLS:
        problem = result.control_problem(detector)
        control = result.control(detector)
        duration = 0.0 if control is None else control.duration_s
        tests.append(_outcome(control_test(detector), [problem] if problem else [], duration))
    return tuple(tests)


def _outcome(nodeid: str, problems: list[str], duration: float = 0.0) -> TestOutcome:
    if problems:
        return TestOutcome(nodeid, "failed", duration, message="; ".join(problems))
    return TestOutcome(nodeid, "passed", duration)
