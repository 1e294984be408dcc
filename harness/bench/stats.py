"""Robust summaries of timing samples: medians and spreads, never means.

Machines here are shared and noisy: a mean is dragged by the one iteration that lost its core,
a median is not. Spreads are the 10th/90th percentiles and the interquartile range, so a reader
can see how far apart two medians must be before the difference means something.

Ratios come in two forms. `ratio_of_medians` divides one summary's median by another's. When
two variants were timed in the same iterations (interleaved, `paired_ratio`), the per-iteration
ratios are summarized too: their spread says how stable the comparison is, which two
independent spreads cannot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from harness.errors import UsageError


def quantile(samples: Sequence[float], q: float) -> float:
    """The `q`-quantile with linear interpolation between order statistics (numpy's default)."""
    if not samples:
        raise UsageError("quantile of no samples")
    if not 0.0 <= q <= 1.0:
        raise UsageError(f"quantile q must be in [0, 1], got {q}")
    ordered = sorted(samples)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    """Median and spread of one set of samples (same unit as the samples)."""

    n: int
    median: float
    p10: float
    p90: float
    q1: float
    q3: float
    min: float
    max: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def rel_iqr(self) -> float:
        """IQR over median: 0.05 means the middle half lies within about 5% of the median."""
        return self.iqr / self.median if self.median else math.inf

    def scaled(self, factor: float) -> Summary:
        """The same summary in another unit (seconds -> microseconds: factor 1e6)."""
        return Summary(
            n=self.n,
            median=self.median * factor,
            p10=self.p10 * factor,
            p90=self.p90 * factor,
            q1=self.q1 * factor,
            q3=self.q3 * factor,
            min=self.min * factor,
            max=self.max * factor,
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["iqr"] = self.iqr
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary:
        return cls(**{k: data[k] for k in ("n", "median", "p10", "p90", "q1", "q3", "min", "max")})


def summarize(samples: Sequence[float]) -> Summary:
    """Median, p10/p90, quartiles and range of `samples` (at least one, all finite)."""
    values = [float(s) for s in samples]
    if not values:
        raise UsageError("cannot summarize an empty list of samples")
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise UsageError(f"samples must be finite, got {bad[:3]}")
    return Summary(
        n=len(values),
        median=quantile(values, 0.5),
        p10=quantile(values, 0.1),
        p90=quantile(values, 0.9),
        q1=quantile(values, 0.25),
        q3=quantile(values, 0.75),
        min=min(values),
        max=max(values),
    )


@dataclass(frozen=True)
class Ratio:
    """`numerator` over `denominator`: the ratio of medians, and the per-iteration spread when
    the two were timed side by side (`paired` is None otherwise)."""

    value: float
    numerator: Summary
    denominator: Summary
    paired: Summary | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "numerator_median": self.numerator.median,
            "denominator_median": self.denominator.median,
            "paired": None if self.paired is None else self.paired.to_json(),
        }


def ratio_of_medians(numerator: Summary, denominator: Summary) -> Ratio:
    """median(numerator) / median(denominator); a zero denominator is a usage error."""
    if denominator.median <= 0:
        raise UsageError(f"ratio against a median of {denominator.median}: nothing to divide by")
    return Ratio(numerator.median / denominator.median, numerator, denominator)


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> Ratio:
    """Ratio of medians plus the summary of per-iteration ratios, for interleaved samples."""
    if len(numerator) != len(denominator):
        raise UsageError(f"paired samples differ in length: {len(numerator)} vs {len(denominator)}")
    if any(d <= 0 for d in denominator):
        raise UsageError("paired ratio: a denominator sample is <= 0")
    base = ratio_of_medians(summarize(numerator), summarize(denominator))
    per_iteration = summarize([n / d for n, d in zip(numerator, denominator, strict=True)])
    return Ratio(base.value, base.numerator, base.denominator, per_iteration)


def elementwise_max(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per-iteration maximum over ranks: a collective is done when its slowest rank is done."""
    if not per_rank:
        raise UsageError("no ranks to combine")
    lengths = {len(r) for r in per_rank}
    if len(lengths) != 1:
        raise UsageError(f"ranks recorded different iteration counts: {sorted(lengths)}")
    return [max(values) for values in zip(*per_rank, strict=True)]
