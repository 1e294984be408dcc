"""Driver side: the ranks' raw samples (harness.bench.rank) -> medians, spreads and ratios.

Per iteration, an op's time is its slowest rank's (a collective ends when its last rank does);
a step's time is, per rank, the sum of its ops, then the slowest rank. Ratios are paired: ours
and raw ran in the same iterations, so the per-iteration ratio has a spread of its own.
Times in the JSON are microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.bench.bandwidth import Bandwidth, bandwidth, bus_bytes, collective_kind
from harness.bench.stats import Ratio, Summary, elementwise_max, paired_ratio, summarize
from harness.errors import UsageError

US = 1e6


def _side_max(per_rank: Sequence[Mapping[str, Sequence[float]]], op: str) -> list[float]:
    return elementwise_max([rank[op] for rank in per_rank])


def _step_max(per_rank: Sequence[Mapping[str, Sequence[float]]]) -> list[float]:
    """Per rank, the sum of its ops per iteration; then the slowest rank per iteration."""
    sums = [[sum(values) for values in zip(*rank.values(), strict=True)] for rank in per_rank]
    return elementwise_max(sums)


def _ratio_json(r: Ratio) -> dict[str, Any]:
    data = r.to_json()
    data["numerator_median"] *= US
    data["denominator_median"] *= US
    return data


@dataclass(frozen=True)
class TransportCase:
    """Ours against raw collectives for one (strategy, batch)."""

    strategy: str
    reduce_scatter: str
    batch: int
    world_size: int
    step: Ratio  # ours step / raw step
    gather: Ratio  # ours gather / raw query all-gather
    reduce: Ratio  # ours reduction / raw reduction collectives
    ops: Mapping[str, Summary]  # "ours.gather", "raw.ag_queries", ... (seconds)
    bandwidth: tuple[Bandwidth, ...]

    @property
    def label(self) -> str:
        return f"{self.strategy} B={self.batch}"

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "reduce_scatter": self.reduce_scatter,
            "batch": self.batch,
            "world_size": self.world_size,
            "ours_step_us": self.step.numerator.scaled(US).to_json(),
            "raw_step_us": self.step.denominator.scaled(US).to_json(),
            "ratio": _ratio_json(self.step),
            "gather_ratio": _ratio_json(self.gather),
            "reduce_ratio": _ratio_json(self.reduce),
            "ops_us": {name: s.scaled(US).to_json() for name, s in self.ops.items()},
            "bandwidth": [b.to_json() for b in self.bandwidth],
        }


def transport_case(case_per_rank: Sequence[Mapping[str, Any]], world: int) -> TransportCase:
    """One case from every rank's record of it (same strategy and batch on every rank)."""
    first = case_per_rank[0]
    raw = [c["samples"]["raw"] for c in case_per_rank]
    ours = [c["samples"]["ours"] for c in case_per_rank]
    raw_ops = list(raw[0])
    reduce_ops = [op for op in raw_ops if op != "ag_queries"]
    ops = {f"raw.{op}": summarize(_side_max(raw, op)) for op in raw_ops}
    ops.update({f"ours.{op}": summarize(_side_max(ours, op)) for op in ours[0]})
    raw_reduce = _step_max([{op: r[op] for op in reduce_ops} for r in raw])
    bws = []
    total_bus = 0.0
    for op in raw_ops:
        nbytes = first["bytes"][op]
        moved = bus_bytes(collective_kind(op), nbytes["send"], nbytes["recv"], world)
        total_bus += moved
        bws.append(bandwidth(f"raw.{op}", moved, ops[f"raw.{op}"].median))
    ours_step, raw_step = _step_max(ours), _step_max(raw)
    step = paired_ratio(ours_step, raw_step)
    bws.append(bandwidth("ours.step", total_bus, step.numerator.median))
    bws.append(bandwidth("raw.step", total_bus, step.denominator.median))
    return TransportCase(
        strategy=first["strategy"],
        reduce_scatter=first["reduce_scatter"],
        batch=int(first["batch"]),
        world_size=world,
        step=step,
        gather=paired_ratio(_side_max(ours, "gather"), _side_max(raw, "ag_queries")),
        reduce=paired_ratio(_side_max(ours, "reduce"), raw_reduce),
        ops=ops,
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
        return max(self.cases, key=lambda c: c.step.value)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "world_size": self.world_size,
            "device_name": self.device_name,
            "cases": [c.to_json() for c in self.cases],
        }


def transport_results(raw: Mapping[str, Any]) -> TransportResults:
    ranks = raw["ranks"]
    world = int(raw["world_size"])
    if len(ranks) != world:
        raise UsageError(f"rank results hold {len(ranks)} ranks for world size {world}")
    n_cases = {len(r["transport"]) for r in ranks}
    if len(n_cases) != 1:
        raise UsageError(f"ranks measured different numbers of cases: {sorted(n_cases)}")
    cases = tuple(
        transport_case([r["transport"][i] for r in ranks], world)
        for i in range(len(ranks[0]["transport"]))
    )
    return TransportResults(raw["backend"], world, raw.get("device_name", ""), cases)


@dataclass(frozen=True)
class CaptureOverhead:
    """Eager cost of the capture machinery outside a window: variants against `plain`."""

    strategy: str
    batch: int
    step: Mapping[str, Summary]  # variant -> eager step seconds (slowest rank)
    lookup: Mapping[str, Summary]  # variant -> seconds per registry `get` hit (rank 0)
    step_ratio: Mapping[str, Ratio]  # variant / plain, paired
    lookup_ratio: Mapping[str, Ratio]
    unavailable: str | None

    @property
    def overhead_pct(self) -> float | None:
        """after_window vs plain on the eager step, in percent (None if not measured)."""
        ratio = self.step_ratio.get("after_window")
        return None if ratio is None else (ratio.value - 1.0) * 100.0

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "batch": self.batch,
            "unavailable": self.unavailable,
            "overhead_pct": self.overhead_pct,
            "step_us": {k: v.scaled(US).to_json() for k, v in self.step.items()},
            "lookup_ns": {k: v.scaled(1e9).to_json() for k, v in self.lookup.items()},
            "step_ratio": {k: r.to_json() for k, r in self.step_ratio.items()},
            "lookup_ratio": {k: r.to_json() for k, r in self.lookup_ratio.items()},
        }


def capture_overhead(raw: Mapping[str, Any]) -> CaptureOverhead:
    records = [r["capture"] for r in raw["ranks"]]
    first = records[0]
    variants = list(first["step"])
    steps = {v: elementwise_max([r["step"][v] for r in records]) for v in variants}
    lookups = {v: list(first["lookup"][v]) for v in variants}  # rank 0 only: a local loop
    others = [v for v in variants if v != "plain"]
    return CaptureOverhead(
        strategy=first["strategy"],
        batch=int(first["batch"]),
        step={v: summarize(s) for v, s in steps.items()},
        lookup={v: summarize(s) for v, s in lookups.items()},
        step_ratio={v: paired_ratio(steps[v], steps["plain"]) for v in others},
        lookup_ratio={v: paired_ratio(lookups[v], lookups["plain"]) for v in others},
        unavailable=first.get("unavailable"),
    )
