"""Driver side: the ranks' raw samples (harness.bench.rank) -> medians, spreads and ratios.

Per iteration an op's time is its slowest rank's (a collective ends when its last rank does); a
step's time is, per rank, the sum of its ops, then the slowest rank. Ratios are paired: ours and
raw ran in the same iterations. Times in the JSON are microseconds (lookups: nanoseconds); the
medians inside a capture ratio are seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.bench.stats import (
    Bandwidth,
    Ratio,
    Summary,
    bandwidth,
    bus_bytes,
    paired_ratio,
    slowest_rank,
    summarize,
)
from harness.errors import UsageError

US = 1e6
Samples = Sequence[Mapping[str, Sequence[float]]]  # per rank: op -> seconds per iteration


def _op(per_rank: Samples, op: str) -> np.ndarray:
    return slowest_rank([rank[op] for rank in per_rank])


def _step(per_rank: Samples, ops: Sequence[str] | None = None) -> np.ndarray:
    """Per rank the sum of its ops (all, or `ops`) per iteration; then the slowest rank."""
    return slowest_rank([np.sum([r[op] for op in (ops or list(r))], axis=0) for r in per_rank])


@dataclass(frozen=True)
class TransportCase:
    """Ours against raw collectives for one (strategy, batch)."""

    strategy: str
    reduce_scatter: str
    batch: int
    world_size: int
    ours_step_us: Summary
    raw_step_us: Summary
    ratio: Ratio  # ours step / raw step (medians in us)
    gather_ratio: Ratio  # ours gather / raw query all-gather
    reduce_ratio: Ratio  # ours reduction / raw reduction collectives
    ops_us: Mapping[str, Summary]  # "ours.gather", "raw.ag_queries", ...
    bandwidth: tuple[Bandwidth, ...]

    @property
    def label(self) -> str:
        return f"{self.strategy} B={self.batch}"


def transport_case(per_rank: Sequence[Mapping[str, Any]], world: int) -> TransportCase:
    """One case from every rank's record of it (same strategy and batch on every rank)."""
    first = per_rank[0]
    raw = [c["samples"]["raw"] for c in per_rank]
    ours = [c["samples"]["ours"] for c in per_rank]
    raw_names = list(raw[0])
    ops = {f"raw.{op}": summarize(_op(raw, op) * US) for op in raw_names}
    ops.update({f"ours.{op}": summarize(_op(ours, op) * US) for op in ours[0]})
    moved = {
        op: bus_bytes(op, first["bytes"][op]["send"], first["bytes"][op]["recv"], world)
        for op in raw_names
    }
    step = paired_ratio(_step(ours) * US, _step(raw) * US)
    bws = [bandwidth(f"raw.{op}", moved[op], ops[f"raw.{op}"].median / US) for op in raw_names]
    bws += [
        bandwidth(f"{side}.step", sum(moved.values()), median / US)
        for side, median in (("ours", step.numerator_median), ("raw", step.denominator_median))
    ]
    reduce_ops = [op for op in raw_names if op != "ag_queries"]
    return TransportCase(
        strategy=first["strategy"],
        reduce_scatter=first["reduce_scatter"],
        batch=int(first["batch"]),
        world_size=world,
        ours_step_us=summarize(_step(ours) * US),
        raw_step_us=summarize(_step(raw) * US),
        ratio=step,
        gather_ratio=paired_ratio(_op(ours, "gather") * US, _op(raw, "ag_queries") * US),
        reduce_ratio=paired_ratio(_op(ours, "reduce") * US, _step(raw, reduce_ops) * US),
        ops_us=ops,
        bandwidth=tuple(bws),
    )


@dataclass(frozen=True)
class TransportResults:
    backend: str
    world_size: int
    device_name: str
    cases: tuple[TransportCase, ...]

    @property
    def worst(self) -> TransportCase:
        return max(self.cases, key=lambda c: c.ratio.value)


def transport_results(raw: Mapping[str, Any]) -> TransportResults:
    ranks, world = raw["ranks"], int(raw["world_size"])
    if len(ranks) != world:
        raise UsageError(f"rank results hold {len(ranks)} ranks for world size {world}")
    n_cases = {len(r["transport"]) for r in ranks}
    if len(n_cases) != 1:
        raise UsageError(f"ranks measured different numbers of cases: {sorted(n_cases)}")
    cases = tuple(
        transport_case([r["transport"][i] for r in ranks], world) for i in range(n_cases.pop())
    )
    return TransportResults(raw["backend"], world, raw.get("device_name", ""), cases)


@dataclass(frozen=True)
class CaptureOverhead:
    """Eager cost of the capture machinery outside a window: variants against `plain`."""

    strategy: str
    batch: int
    unavailable: str | None
    overhead_pct: float | None  # after_window vs plain on the eager step (None: not measured)
    step_us: Mapping[str, Summary]  # variant -> eager step (slowest rank)
    lookup_ns: Mapping[str, Summary]  # variant -> one registry `get` hit (rank 0)
    step_ratio: Mapping[str, Ratio]  # variant / plain, paired (medians in seconds)
    lookup_ratio: Mapping[str, Ratio]


def capture_overhead(raw: Mapping[str, Any]) -> CaptureOverhead:
    records = [r["capture"] for r in raw["ranks"]]
    first = records[0]
    steps = {v: slowest_rank([r["step"][v] for r in records]) for v in first["step"]}
    lookups = {v: np.asarray(s, dtype=float) for v, s in first["lookup"].items()}  # rank 0 only
    others = [v for v in steps if v != "plain"]
    step_ratio = {v: paired_ratio(steps[v], steps["plain"]) for v in others}
    after = step_ratio.get("after_window")
    return CaptureOverhead(
        strategy=first["strategy"],
        batch=int(first["batch"]),
        unavailable=first.get("unavailable"),
        overhead_pct=None if after is None else (after.value - 1.0) * 100.0,
        step_us={v: summarize(s * US) for v, s in steps.items()},
        lookup_ns={v: summarize(s * 1e9) for v, s in lookups.items()},
        step_ratio=step_ratio,
        lookup_ratio={v: paired_ratio(lookups[v], lookups["plain"]) for v in others},
    )
