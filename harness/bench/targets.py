"""The harness's performance targets and their evaluation: measured, reported, never asserted.

Every target is an upper bound ("<= threshold"). A target the run did not measure (a section
skipped, a measurement that failed) is `not-measured`, with the reason, never a pass. A miss says
by how much, so a note about it can start from the number.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from harness.errors import UsageError

# The bench's sections, in the order they run; `--skip` takes these names.
SECTIONS: tuple[str, ...] = ("transport", "capture", "discovery", "launch", "real")

Outcome = Literal["pass", "miss", "not-measured"]
OUTCOMES: tuple[str, ...] = ("pass", "miss", "not-measured")


@dataclass(frozen=True)
class Target:
    """One upper bound on one measured quantity."""

    key: str
    description: str
    threshold: float
    unit: str

    def __post_init__(self) -> None:
        if not self.threshold > 0:
            raise UsageError(f"target {self.key}: threshold must be > 0, got {self.threshold}")


TRANSPORT = Target("transport_overhead", "transport step vs raw collectives", 1.15, "x")
LAUNCH = Target("suite_vs_bare_launch", "full dcpqual run vs bare torchrun launch", 2.0, "x")
DISCOVERY = Target("discovery_us_per_module", "vendored discovery per module", 10.0, "us")
CAPTURE = Target("capture_overhead_outside_window", "capture machinery, no window open", 2.0, "%")
MEMORY = Target("peak_rss_per_rank", "peak RSS of a rank during the suites", 400.0, "MB")
REAL_MEMORY = Target(
    "peak_rss_per_rank_real", "peak RSS of a rank during the suites on real trees", 1.2, "GiB"
)
TARGETS: tuple[Target, ...] = (TRANSPORT, LAUNCH, DISCOVERY, CAPTURE, MEMORY, REAL_MEMORY)


@dataclass(frozen=True)
class TargetResult:
    """A target against what was measured: pass, miss (with the excess), or not measured."""

    target: Target
    outcome: Outcome
    measured: float | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise UsageError(f"unknown target outcome {self.outcome!r}; expected {OUTCOMES}")
        if (self.measured is None) != (self.outcome == "not-measured"):
            raise UsageError(
                f"target {self.target.key}: outcome {self.outcome!r} with measured={self.measured}"
            )

    @property
    def excess(self) -> float | None:
        """How far over the bound, as a fraction of it (0.12 = 12% over); None unless missed."""
        if self.outcome != "miss" or self.measured is None:
            return None
        return self.measured / self.target.threshold - 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self.target),
            "outcome": self.outcome,
            "measured": self.measured,
            "excess": self.excess,
            "detail": self.detail,
        }


def evaluate(target: Target, measured: float | None, detail: str = "") -> TargetResult:
    """pass when `measured <= threshold`, miss above it, not-measured for None."""
    if measured is None:
        return TargetResult(target, "not-measured", None, detail)
    outcome: Outcome = "pass" if measured <= target.threshold else "miss"
    return TargetResult(target, outcome, float(measured), detail)
