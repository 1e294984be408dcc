"""The bench report: every section's results and the target outcomes, its JSON form (schema
"dcpqual-bench/v1", fields only added) and the printed tables.

A section that was skipped or failed is None in `results` and its targets are `not-measured`
with the reason; nothing is ever filled in with a guess.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TextIO

from rich.console import Console
from rich.table import Table

from harness.atomic import atomic_write_text
from harness.bench.discovery_bench import DiscoveryResult
from harness.bench.launch_bench import LaunchResult
from harness.bench.results import CaptureOverhead, TransportResults
from harness.bench.stats import Summary
from harness.bench.targets import (
    CAPTURE,
    DISCOVERY,
    LAUNCH,
    MEMORY,
    REAL_MEMORY,
    TRANSPORT,
    TargetResult,
    evaluate,
)
from harness.errors import UsageError


@dataclass(frozen=True)
class BenchReport:
    created_at: str
    environment: Mapping[str, Any]
    options: Mapping[str, Any]
    transport: TransportResults | None = None
    capture: CaptureOverhead | None = None
    discovery: DiscoveryResult | None = None
    launch: LaunchResult | None = None
    real: LaunchResult | None = None  # the full run on vLLM's real trees
    why_missing: Mapping[str, str] = field(default_factory=dict)  # section -> skipped/failed why
    notes: tuple[str, ...] = ()

    SCHEMA: ClassVar[str] = "dcpqual-bench/v1"

    @property
    def targets(self) -> tuple[TargetResult, ...]:
        return evaluate_targets(self)

    @property
    def complete(self) -> bool:
        """Every requested section measured (skips are not failures) and every suite run passed."""
        failed = any(not why.startswith("skipped") for why in self.why_missing.values())
        runs = [r for r in (self.launch, self.real) if r is not None]
        return not failed and not any(any(r.suite_exit_codes) for r in runs)

    def to_json(self) -> dict[str, Any]:
        sections = ("transport", "capture", "discovery", "launch", "real")
        results = {s: getattr(self, s) for s in sections}
        return {
            "schema": self.SCHEMA,
            "created_at": self.created_at,
            "environment": dict(self.environment),
            "options": dict(self.options),
            "results": {s: None if v is None else asdict(v) for s, v in results.items()},
            "missing": dict(self.why_missing),
            "targets": [t.to_json() for t in self.targets],
            "complete": self.complete,
            "notes": list(self.notes),
        }


def _spread(s: Summary, scale: float = 1.0, fmt: str = ".0f") -> str:
    return f"{s.median * scale:{fmt}} [{s.p10 * scale:{fmt}}-{s.p90 * scale:{fmt}}]"


def _memory(target: Any, run: LaunchResult | None, missing: str) -> TargetResult:
    if run is None or run.peak_rss_mb is None:
        return evaluate(target, None, "no rank reported its peak RSS" if run else missing)
    worst = max(run.peak_rss_mb_per_rank, key=lambda r: run.peak_rss_mb_per_rank[r])
    value = run.peak_rss_gib if target.unit == "GiB" else run.peak_rss_mb
    detail = f"rank {worst} of {len(run.peak_rss_mb_per_rank)} ({run.models}, ru_maxrss)"
    return evaluate(target, value, detail)


def evaluate_targets(report: BenchReport) -> tuple[TargetResult, ...]:
    """Each target from its section; a missing section gives `not-measured` with the reason."""

    def missing(section: str) -> str:
        return report.why_missing.get(section, f"{section} not measured")

    out = []
    t = report.transport
    if t is not None and t.cases:
        over = [c.label for c in t.cases if c.ratio.value > TRANSPORT.threshold]
        detail = f"worst {t.worst.label} at {t.world_size} {t.backend} ranks; over the bound: "
        out.append(evaluate(TRANSPORT, t.worst.ratio.value, detail + (", ".join(over) or "none")))
    else:
        out.append(evaluate(TRANSPORT, None, missing("transport")))
    launch = report.launch
    if launch is not None and launch.ratio is not None and launch.bare_launch_s is not None:
        detail = (
            f"full {_spread(launch.full_suite_s, fmt='.1f')} s vs bare "
            f"{_spread(launch.bare_launch_s, fmt='.1f')} s, {launch.world_size} ranks, exit "
            + ",".join(map(str, launch.suite_exit_codes))
        )
        out.append(evaluate(LAUNCH, launch.ratio.value, detail))
    else:
        out.append(evaluate(LAUNCH, None, missing("launch")))
    d = report.discovery
    if d is not None:
        detail = (
            f"{_spread(d.us_per_module, fmt='.2f')} us, {d.modules} modules ({d.layers} layers)"
        )
        out.append(evaluate(DISCOVERY, d.us_per_module.median, detail))
    else:
        out.append(evaluate(DISCOVERY, None, missing("discovery")))
    cap = report.capture
    if cap is not None and cap.overhead_pct is not None:
        detail = f"eager step {cap.strategy} B={cap.batch} {_spread(cap.step_us['plain'])} us"
        lookup = cap.lookup_ratio.get("after_window")
        if lookup is not None:
            detail += f"; registry get {(lookup.value - 1) * 100:+.1f}%"
        out.append(evaluate(CAPTURE, cap.overhead_pct, detail))
    else:
        why = cap.unavailable if cap is not None and cap.unavailable else missing("capture")
        out.append(evaluate(CAPTURE, None, why))
    out.append(_memory(MEMORY, launch, missing("launch")))
    out.append(_memory(REAL_MEMORY, report.real, missing("real")))
    return tuple(out)


def write_report(report: BenchReport, path: Path) -> None:
    """Write the JSON atomically; refuses to overwrite (results are evidence)."""
    if path.exists():
        raise UsageError(f"{path} already exists; bench results are never overwritten")
    atomic_write_text(path, json.dumps(report.to_json(), indent=2, allow_nan=False) + "\n")


def transport_table(t: TransportResults) -> Table:
    nccl = t.backend == "nccl"
    table = Table(
        title=f"Transport: ours vs raw collectives ({t.world_size} {t.backend} ranks, "
        "Kimi-K3 96 x 576 -> 512 bf16), us median \\[p10-p90]"
    )
    for col in ("case", "ours step", "raw step", "ratio \\[p10-p90]", "gather x", "reduce x"):
        table.add_column(col, justify="left" if col == "case" else "right")
    table.add_column("busbw ours/raw GB/s" + (" (PCIe5 x16 %)" if nccl else ""), justify="right")
    for c in t.cases:
        bw = {b.op: b for b in c.bandwidth}
        ours, raw = bw["ours.step"], bw["raw.step"]
        text = f"{ours.busbw_gb_s:.2f}/{raw.busbw_gb_s:.2f}"
        if nccl:
            text += f" ({ours.pcie_gen5_x16_fraction:.0%}/{raw.pcie_gen5_x16_fraction:.0%})"
        ratio = f"{c.ratio.value:.2f}"
        if c.ratio.paired is not None:
            ratio += f" [{c.ratio.paired.p10:.2f}-{c.ratio.paired.p90:.2f}]"
        table.add_row(
            c.label,
            _spread(c.ours_step_us),
            _spread(c.raw_step_us),
            ratio,
            f"{c.gather_ratio.value:.2f}",
            f"{c.reduce_ratio.value:.2f}",
            text,
        )
    return table


def profile_table(run: LaunchResult) -> Table:
    """Where one full run's time went, per rank (median and slowest over ranks)."""
    assert run.profile is not None
    p = run.profile
    table = Table(
        title=f"Profile: full dcpqual run ({run.models}, {run.world_size} ranks, "
        f"{run.full_suite_s.median:.1f} s wall, {p['cpu_s_all_ranks']:.0f} CPU-s), seconds"
    )
    for col in ("phase", "median rank", "slowest rank"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    table.add_row(
        "launcher, torchrun, python + pytest start", f"{p['launcher_before_ranks_s']:.1f}", ""
    )
    for name, v in p["phases_s"].items():
        table.add_row(name, f"{v['median']:.1f}", f"{v['max']:.1f}")
    table.add_row("ranks (probe loaded -> pytest done)", f"{p['ranks_s']:.1f}", "")
    table.add_row(
        "rank exit, bundle written and verified", f"{p['launcher_after_ranks_s']:.1f}", ""
    )
    return table


def targets_table(report: BenchReport) -> Table:
    table = Table(title="Targets (measured, not asserted)")
    for col in ("target", "measured", "bound", "outcome", "detail"):
        table.add_column(col, justify="right" if col in ("measured", "bound") else "left")
    style = {"pass": "green", "miss": "red", "not-measured": "yellow"}
    for t in report.targets:
        outcome = t.outcome if t.excess is None else f"miss (+{t.excess:.0%})"
        table.add_row(
            t.target.key,
            "-" if t.measured is None else f"{t.measured:.2f}",
            f"<= {t.target.threshold:g} {t.target.unit}",
            f"[{style[t.outcome]}]{outcome}[/]",
            t.detail,
        )
    return table


def print_report(report: BenchReport, stream: TextIO | None = None) -> None:
    console = Console(file=stream, width=160, soft_wrap=False)
    if report.transport is not None:
        console.print(transport_table(report.transport))
    for run in (report.launch, report.real):
        if run is not None and run.profile is not None:
            console.print(profile_table(run))
    console.print(targets_table(report))
    for section, why in report.why_missing.items():
        console.print(f"{section}: {why}", markup=False)
    for note in report.notes:
        console.print(f"note: {note}", markup=False)
