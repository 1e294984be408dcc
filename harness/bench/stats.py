"""The arithmetic the bench's numbers rest on: robust summaries (numpy's quantiles), ratios and
bus bandwidth.

Machines here are shared and noisy: a mean is dragged by the one iteration that lost its core, a
median is not. Bus bandwidth follows nccl-tests: `busbw = size / time * (n-1)/n`, size the
gathered output (all-gather) or the input (reduce-scatter, all-to-all), against one PCIe Gen5
x16 link (64 GB/s per direction, theoretical: 32 GT/s x 16 lanes, 128b/130b).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from harness.errors import UsageError
from harness.schema.bench import Bandwidth, Ratio, Summary

PCIE_GEN5_X16_BYTES_PER_S = 64e9
KINDS = {"ag_": "all_gather", "rs_": "reduce_scatter", "a2a_": "all_to_all"}


def summarize(samples: npt.ArrayLike, scale: float = 1.0) -> Summary:
    """Median, p10/p90, quartiles and range of the samples times `scale` (s -> us: 1e6)."""
    values = np.asarray(samples, dtype=float) * scale
    if values.size == 0 or not np.isfinite(values).all():
        raise UsageError(f"cannot summarize {values.size} samples with non-finite or none")
    p10, q1, median, q3, p90 = np.quantile(values, (0.1, 0.25, 0.5, 0.75, 0.9)).tolist()
    low, high = float(values.min()), float(values.max())
    return Summary(n=values.size, median=median, p10=p10, p90=p90, q1=q1, q3=q3, min=low,
                   max=high, iqr=q3 - q1)  # fmt: skip


def ratio_of_medians(numerator: Summary, denominator: Summary) -> Ratio:
    if denominator.median <= 0:
        raise UsageError(f"ratio: denominator median {denominator.median} leaves nothing to divide")
    return Ratio(value=numerator.median / denominator.median, numerator_median=numerator.median,
                 denominator_median=denominator.median)  # fmt: skip


def paired_ratio(numerator: npt.ArrayLike, denominator: npt.ArrayLike) -> Ratio:
    """Ratio of medians, plus the summary of the per-iteration ratios."""
    num, den = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if num.shape != den.shape:
        raise UsageError(f"paired samples differ in length: {num.size} vs {den.size}")
    if (den <= 0).any():
        raise UsageError("paired ratio: a denominator sample is <= 0")
    base = ratio_of_medians(summarize(num), summarize(den))
    return base.model_copy(update={"paired": summarize(num / den)})


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
    return Bandwidth(op=op, bus_bytes=nbytes, seconds=seconds, busbw_gb_s=rate / 1e9,
                     pcie_gen5_x16_fraction=rate / PCIE_GEN5_X16_BYTES_PER_S)  # fmt: skip
