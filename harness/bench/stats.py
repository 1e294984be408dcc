"""Robust summaries of timing samples (numpy's quantiles): medians and spreads, never means.

Machines here are shared and noisy: a mean is dragged by the one iteration that lost its core, a
median is not. When two variants ran in the same iterations, the per-iteration ratios are
summarized too (`paired`): their spread says how stable the comparison is.

Bus bandwidth follows nccl-tests: `busbw = size / time * (n-1)/n`, size the gathered output
(all-gather) or the input (reduce-scatter, all-to-all), against one PCIe Gen5 x16 link (64 GB/s
per direction, theoretical: 32 GT/s x 16 lanes, 128b/130b).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass

import numpy as np
import numpy.typing as npt

from harness.errors import UsageError

PCIE_GEN5_X16_BYTES_PER_S = 64e9
KINDS = {"ag_": "all_gather", "rs_": "reduce_scatter", "a2a_": "all_to_all"}


@dataclass(frozen=True)
class Summary:
    """Median and spread of one set of samples, in the samples' unit."""

    n: int
    median: float
    p10: float
    p90: float
    q1: float
    q3: float
    min: float
    max: float
    iqr: float

    def scaled(self, factor: float) -> Summary:
        """The same summary in another unit (seconds -> microseconds: factor 1e6)."""
        return Summary(self.n, *(v * factor for v in astuple(self)[1:]))


def summarize(samples: npt.ArrayLike) -> Summary:
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        raise UsageError("cannot summarize an empty list of samples")
    if not np.isfinite(values).all():
        raise UsageError(f"samples must be finite, got {values[~np.isfinite(values)][:3]}")
    p10, q1, median, q3, p90 = (float(v) for v in np.quantile(values, (0.1, 0.25, 0.5, 0.75, 0.9)))
    return Summary(
        int(values.size),
        median,
        p10,
        p90,
        q1,
        q3,
        float(values.min()),
        float(values.max()),
        q3 - q1,
    )


@dataclass(frozen=True)
class Ratio:
    """Ratio of medians, and the summary of per-iteration ratios for interleaved samples."""

    value: float
    numerator_median: float
    denominator_median: float
    paired: Summary | None = None


def ratio_of_medians(numerator: Summary, denominator: Summary) -> Ratio:
    if denominator.median <= 0:
        raise UsageError(f"ratio against a median of {denominator.median}: nothing to divide by")
    return Ratio(numerator.median / denominator.median, numerator.median, denominator.median)


def paired_ratio(numerator: npt.ArrayLike, denominator: npt.ArrayLike) -> Ratio:
    num, den = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if num.shape != den.shape:
        raise UsageError(f"paired samples differ in length: {num.size} vs {den.size}")
    if (den <= 0).any():
        raise UsageError("paired ratio: a denominator sample is <= 0")
    base = ratio_of_medians(summarize(num), summarize(den))
    return Ratio(base.value, base.numerator_median, base.denominator_median, summarize(num / den))


def slowest_rank(per_rank: Sequence[Sequence[float]]) -> npt.NDArray[np.float64]:
    """Per-iteration maximum over ranks: a collective is done when its slowest rank is."""
    lengths = {len(r) for r in per_rank}
    if len(lengths) != 1:
        raise UsageError(f"ranks recorded different iteration counts: {sorted(lengths)}")
    slowest: npt.NDArray[np.float64] = np.asarray(per_rank, dtype=float).max(axis=0)
    return slowest


@dataclass(frozen=True)
class Bandwidth:
    """One op's bus bandwidth at its median time, and its fraction of a PCIe Gen5 x16 link."""

    op: str
    bus_bytes: float
    seconds: float
    busbw_gb_s: float
    pcie_gen5_x16_fraction: float


def bus_bytes(op: str, send: int, recv: int, world: int) -> float:
    """Bytes a ring moves per link for one collective named by what it moves (`ag_queries`)."""
    kind = next((k for prefix, k in KINDS.items() if op.startswith(prefix)), None)
    if kind is None or world < 1:
        raise UsageError(f"no collective kind for op {op!r} at world size {world}")
    return (recv if kind == "all_gather" else send) * (world - 1) / world


def bandwidth(op: str, nbytes: float, seconds: float) -> Bandwidth:
    if seconds <= 0:
        raise UsageError(f"bandwidth of {op}: time must be > 0, got {seconds}")
    rate = nbytes / seconds
    return Bandwidth(op, nbytes, seconds, rate / 1e9, rate / PCIE_GEN5_X16_BYTES_PER_S)
