"""The bench report: the targets (measured and reported, never asserted), each evaluated from
its section, the JSON written once (never overwritten), and the printed tables.

A section that was skipped or failed is None in `results` and its targets are `not-measured`
with the reason; nothing is ever filled in with a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.table import Table

from harness.atomic import atomic_write_text
from harness.errors import UsageError
from harness.schema.bench import (
    BenchOptions,
    BenchReport,
    Environment,
    Results,
    SuiteRuns,
    Summary,
    TargetResult,
)


@dataclass(frozen=True)
class Target:
    """One upper bound ("<= threshold") on one measured quantity."""

    key: str
    description: str
    threshold: float
    unit: str

    def evaluate(self, measured: float | None, detail: str = "") -> TargetResult:
        """pass when `measured <= threshold`, miss above it, not-measured for None."""
        over = measured is not None and measured > self.threshold
        return TargetResult(
            key=self.key, description=self.description, threshold=self.threshold, unit=self.unit,
            outcome="not-measured" if measured is None else "miss" if over else "pass",
            measured=None if measured is None else float(measured),
            excess=measured / self.threshold - 1.0 if over and measured is not None else None,
            detail=detail,
        )  # fmt: skip


TRANSPORT = Target("transport_overhead", "transport step vs raw collectives", 1.15, "x")
LAUNCH = Target("suite_vs_bare_launch", "full dcpqual run vs bare torchrun launch", 2.0, "x")
DISCOVERY = Target("discovery_us_per_module", "vendored discovery per module", 10.0, "us")
CAPTURE = Target("capture_overhead_outside_window", "capture machinery, no window open", 2.0, "%")
MEMORY = Target("peak_rss_per_rank", "peak RSS of a rank during the suites", 400.0, "MB")
REAL_MEMORY = Target(
    "peak_rss_per_rank_real", "peak RSS of a rank during the suites on real trees", 1.2, "GiB"
)
TARGETS = (TRANSPORT, LAUNCH, DISCOVERY, CAPTURE, MEMORY, REAL_MEMORY)


def _spread(s: Summary, fmt: str = ".0f") -> str:
    return f"{s.median:{fmt}} [{s.p10:{fmt}}-{s.p90:{fmt}}]"


def _memory(target: Target, run: SuiteRuns | None, missing: str) -> TargetResult:
    if run is None or run.peak_rss_mb is None:
        return target.evaluate(None, "no rank reported its peak RSS" if run else missing)
    per_rank = run.peak_rss_mb_per_rank
    worst = max(per_rank, key=per_rank.__getitem__)
    value = run.peak_rss_gib if target.unit == "GiB" else run.peak_rss_mb
    return target.evaluate(value, f"rank {worst} of {len(per_rank)} ({run.models}, ru_maxrss)")


def evaluate_targets(r: Results, missing: Mapping[str, str]) -> tuple[TargetResult, ...]:
    """Each target from its section; a missing section gives `not-measured` with the reason."""

    def why(section: str) -> str:
        return missing.get(section, f"{section} not measured")

    out = []
    if (t := r.transport) is not None and t.cases:
        cases = ", ".join(f"{c.label} {c.ratio.value:.2f}" for c in t.cases)
        detail = f"worst {t.worst.label} at {t.world_size} {t.backend} ranks; {cases}"
        out.append(TRANSPORT.evaluate(t.worst.ratio.value, detail))
    else:
        out.append(TRANSPORT.evaluate(None, why("transport")))
    if (run := r.launch) is not None and run.ratio is not None and run.bare_launch_s is not None:
        detail = (
            f"full {_spread(run.full_suite_s, '.1f')} s vs bare {_spread(run.bare_launch_s, '.1f')}"
            f" s, {run.world_size} ranks, exit {','.join(map(str, run.suite_exit_codes))}"
        )
        out.append(LAUNCH.evaluate(run.ratio.value, detail))
    else:
        out.append(LAUNCH.evaluate(None, why("launch")))
    if (d := r.discovery) is not None:
        detail = f"{_spread(d.us_per_module, '.2f')} us, {d.modules} modules ({d.layers} layers)"
        out.append(DISCOVERY.evaluate(d.us_per_module.median, detail))
    else:
        out.append(DISCOVERY.evaluate(None, why("discovery")))
    if (cap := r.capture) is not None:
        detail = f"eager step {cap.strategy} B={cap.batch} {_spread(cap.step_us['plain'])} us"
        if (lookup := cap.lookup_ratio.get("after_window")) is not None:
            detail += f"; registry get {(lookup.value - 1) * 100:+.1f}%"
        out.append(CAPTURE.evaluate(cap.overhead_pct, detail))
    else:
        out.append(CAPTURE.evaluate(None, why("capture")))
    out.append(_memory(MEMORY, r.launch, why("launch")))
    out.append(_memory(REAL_MEMORY, r.real, why("real")))
    return tuple(out)


def build_report(
    *,
    created_at: str,
    environment: Environment,
    options: BenchOptions,
    results: Results,
    missing: Mapping[str, str],
    notes: Sequence[str] = (),
) -> BenchReport:
    """The report with its targets and `complete`: every requested section measured (skips are
    not failures) and every suite run passed."""
    failed = any(not why.startswith("skipped") for why in missing.values())
    runs = [run for run in (results.launch, results.real) if run is not None]
    return BenchReport(
        created_at=created_at,
        environment=environment,
        options=options,
        results=results,
        missing=dict(missing),
        targets=evaluate_targets(results, missing),
        complete=not failed and not any(any(run.suite_exit_codes) for run in runs),
        notes=tuple(notes),
    )


def write_report(report: BenchReport, path: Path) -> None:
    """Write the JSON atomically; refuses to overwrite (results are evidence)."""
    if path.exists():
        raise UsageError(f"{path} already exists; bench results are never overwritten")
    atomic_write_text(path, report.model_dump_json(by_alias=True, indent=2) + "\n")


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 or col in ("outcome", "detail") else "right")
    return table


def print_report(report: BenchReport, stream: TextIO | None = None) -> None:
    console = Console(file=stream, width=160, soft_wrap=False)
    for run in (report.results.launch, report.results.real):
        if run is not None and (p := run.profile) is not None:
            table = _table(
                f"Profile: full dcpqual run ({run.models}, {run.world_size} ranks, "
                f"{run.full_suite_s.median:.1f} s wall, {p.cpu_s_all_ranks:.0f} CPU-s), seconds",
                *("phase", "median rank", "slowest rank"),
            )
            table.add_row(
                "launcher, torchrun, python + pytest start", f"{p.launcher_before_ranks_s:.1f}", ""
            )
            for name, v in p.phases_s.items():
                table.add_row(name, f"{v.median:.1f}", f"{v.max:.1f}")
            table.add_row("ranks (probe loaded -> pytest done)", f"{p.ranks_s:.1f}", "")
            table.add_row(
                "rank exit, bundle written and verified", f"{p.launcher_after_ranks_s:.1f}", ""
            )
            console.print(table)
    table = _table(
        "Targets (measured, not asserted)", "target", "measured", "bound", "outcome", "detail"
    )
    style = {"pass": "green", "miss": "red", "not-measured": "yellow"}
    for r in report.targets:
        outcome = r.outcome if r.excess is None else f"miss (+{r.excess:.0%})"
        measured = "-" if r.measured is None else f"{r.measured:.2f}"
        table.add_row(
            r.key,
            measured,
            f"<= {r.threshold:g} {r.unit}",
            f"[{style[r.outcome]}]{outcome}[/]",
            r.detail,
        )
    console.print(table)
    for section, why in report.missing.items():
        console.print(f"{section}: {why}", markup=False)
    for note in report.notes:
        console.print(f"note: {note}", markup=False)
