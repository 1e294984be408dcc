"""The bench report: one value holding every section's results and the target outcomes, its
JSON form (schema "dcpqual-bench/v1") and the printed tables.

A section that was skipped or failed is None in `results` and its targets are `not-measured`
with the reason; nothing is ever filled in with a guess.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TextIO

from rich.console import Console
from rich.table import Table

from harness.bench.discovery_bench import DiscoveryResult
from harness.bench.launch_bench import LaunchResult
from harness.bench.rank_results import CaptureOverhead, TransportResults
from harness.bench.stats import Summary
from harness.bench.targets import (
    CAPTURE,
    DISCOVERY,
    LAUNCH,
    MEMORY,
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
        suite_failed = self.launch is not None and any(self.launch.suite_exit_codes)
        return not failed and not suite_failed

    def to_json(self) -> dict[str, Any]:
        def part(value: Any) -> Any:
            return None if value is None else value.to_json()

        return {
            "schema": self.SCHEMA,
            "created_at": self.created_at,
            "environment": dict(self.environment),
            "options": dict(self.options),
            "results": {
                "transport": part(self.transport),
                "capture": part(self.capture),
                "discovery": part(self.discovery),
                "launch": part(self.launch),
            },
            "missing": dict(self.why_missing),
            "targets": [t.to_json() for t in self.targets],
            "complete": self.complete,
            "notes": list(self.notes),
        }


def evaluate_targets(report: BenchReport) -> tuple[TargetResult, ...]:
    """Each target from its section; a missing section gives `not-measured` with the reason."""

    def missing(section: str) -> str:
        return report.why_missing.get(section, f"{section} not measured")

    results = []
    if report.transport is not None and report.transport.cases:
        worst = report.transport.worst
        over = [c.label for c in report.transport.cases if c.step.value > TRANSPORT.threshold]
        detail = f"worst {worst.label} at {report.transport.world_size} {report.transport.backend}"
        detail += f" ranks; over the bound: {', '.join(over) or 'none'}"
        results.append(evaluate(TRANSPORT, worst.step.value, detail))
    else:
        results.append(evaluate(TRANSPORT, None, missing("transport")))

    launch = report.launch
    if launch is not None:
        codes = ",".join(str(c) for c in launch.suite_exit_codes)
        detail = f"{launch.world_size} ranks; suite run exit code(s) {codes}"
        results.append(evaluate(LAUNCH, launch.ratio.value, detail))
    else:
        results.append(evaluate(LAUNCH, None, missing("launch")))

    if report.discovery is not None:
        d = report.discovery
        detail = f"{d.modules} modules ({d.model}, {d.layers} layers)"
        results.append(evaluate(DISCOVERY, d.us_per_module.median, detail))
    else:
        results.append(evaluate(DISCOVERY, None, missing("discovery")))

    cap = report.capture
    if cap is not None and cap.overhead_pct is not None:
        detail = f"eager step {cap.strategy} B={cap.batch}, after a window vs never watched"
        lookup = cap.lookup_ratio.get("after_window")
        if lookup is not None:
            detail += f"; registry get {(lookup.value - 1) * 100:+.1f}%"
        results.append(evaluate(CAPTURE, cap.overhead_pct, detail))
    else:
        why = cap.unavailable if cap is not None and cap.unavailable else missing("capture")
        results.append(evaluate(CAPTURE, None, why or "capture not measured"))

    if launch is not None and launch.peak_rss_mb is not None:
        worst_rank = max(launch.rss_mb, key=lambda r: launch.rss_mb[r])
        detail = f"rank {worst_rank} of {len(launch.rss_mb)} (ru_maxrss)"
        results.append(evaluate(MEMORY, launch.peak_rss_mb, detail))
    else:
        why = "no rank reported ru_maxrss" if launch is not None else missing("launch")
        results.append(evaluate(MEMORY, None, why))
    return tuple(results)


def write_report(report: BenchReport, path: Path) -> None:
    """Write the JSON next to nothing else; refuses to overwrite (results are evidence)."""
    if path.exists():
        raise UsageError(f"{path} already exists; bench results are never overwritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=2, allow_nan=False) + "\n")
    tmp.replace(path)


# -- printed tables ------------------------------------------------------------------------


def _spread(s: Summary, scale: float = 1.0, fmt: str = ".0f") -> str:
    return f"{s.median * scale:{fmt}} [{s.p10 * scale:{fmt}}-{s.p90 * scale:{fmt}}]"


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:{fmt}}"


def transport_table(t: TransportResults) -> Table:
    nccl = t.backend == "nccl"
    table = Table(
        title=f"Transport: ours vs raw collectives ({t.world_size} {t.backend} ranks, "
        f"Kimi-K3 96 x 576 -> 512 bf16), us median [p10-p90]"
    )
    for col in ("case", "ours step", "raw step", "ratio [p10-p90]", "gather x", "reduce x"):
        table.add_column(col, justify="right" if col != "case" else "left")
    table.add_column("busbw ours/raw GB/s" + (" (PCIe5 x16 %)" if nccl else ""), justify="right")
    for c in t.cases:
        bw = {b.op: b for b in c.bandwidth}
        ours_bw, raw_bw = bw["ours.step"], bw["raw.step"]
        bw_text = f"{ours_bw.busbw_gb_s:.2f}/{raw_bw.busbw_gb_s:.2f}"
        if nccl:
            bw_text += (
                f" ({ours_bw.pcie_gen5_x16_fraction:.0%}/{raw_bw.pcie_gen5_x16_fraction:.0%})"
            )
        paired = c.step.paired
        ratio = f"{c.step.value:.2f}"
        if paired is not None:
            ratio += f" [{paired.p10:.2f}-{paired.p90:.2f}]"
        table.add_row(
            c.label,
            _spread(c.step.numerator, 1e6),
            _spread(c.step.denominator, 1e6),
            ratio,
            f"{c.gather.value:.2f}",
            f"{c.reduce.value:.2f}",
            bw_text,
        )
    return table


def other_table(report: BenchReport) -> Table:
    table = Table(title="Discovery, capture machinery, launch, memory: median [p10-p90]")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("against", justify="right")
    table.add_column("ratio", justify="right")
    if report.discovery is not None:
        d = report.discovery
        table.add_row(
            f"discovery us/module ({d.modules} modules)",
            _spread(d.us_per_module, fmt=".2f"),
            "",
            "",
        )
    if report.capture is not None:
        cap = report.capture
        for variant, ratio in cap.step_ratio.items():
            table.add_row(
                f"eager step, {variant} (us)",
                _spread(cap.step[variant], 1e6),
                f"plain {_spread(cap.step['plain'], 1e6)}",
                f"{(ratio.value - 1) * 100:+.1f}%",
            )
        for variant, ratio in cap.lookup_ratio.items():
            table.add_row(
                f"registry get, {variant} (ns)",
                _spread(cap.lookup[variant], 1e9),
                f"plain {_spread(cap.lookup['plain'], 1e9)}",
                f"{(ratio.value - 1) * 100:+.1f}%",
            )
    if report.launch is not None:
        launch = report.launch
        table.add_row(
            f"full dcpqual run, {launch.world_size} ranks (s)",
            _spread(launch.suite_s, fmt=".1f"),
            f"bare {_spread(launch.bare_s, fmt='.1f')}",
            f"{launch.ratio.value:.2f}x",
        )
        table.add_row(
            "peak RSS per rank (MB, max over ranks)", _num(launch.peak_rss_mb, ".0f"), "", ""
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
            _num(t.measured),
            f"<= {t.target.threshold:g} {t.target.unit}",
            f"[{style[t.outcome]}]{outcome}[/]",
            t.detail,
        )
    return table


def print_report(report: BenchReport, stream: TextIO | None = None) -> None:
    console = Console(file=stream, width=160, soft_wrap=False)
    if report.transport is not None:
        console.print(transport_table(report.transport))
    console.print(other_table(report))
    console.print(targets_table(report))
    for section, why in report.why_missing.items():
        console.print(f"{section}: {why}", markup=False)
    for note in report.notes:
        console.print(f"note: {note}", markup=False)
