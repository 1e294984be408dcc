"""The bench's numbers: robust summaries, ratios and bus bandwidth; the targets (measured and
reported, never asserted), each evaluated from its section; the JSON, written once; the tables.

Machines here are shared and noisy: a mean is dragged by the one iteration that lost its core, a
median is not. Bus bandwidth follows nccl-tests: `busbw = size / time * (n-1)/n`, size the
gathered output (all-gather) or the input (reduce-scatter, all-to-all), against one PCIe Gen5
x16 link (64 GB/s per direction, theoretical: 32 GT/s x 16 lanes, 128b/130b). A section that
was skipped or failed is None in `results` and its targets are `not-measured` with the reason;
nothing is ever filled in with a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

import numpy as np
import numpy.typing as npt
from rich.console import Console
from rich.table import Table

from harness.atomic import atomic_write_text
from harness.errors import UsageError
from harness.schema.bench import (
    Bandwidth,
    BenchOptions,
    BenchReport,
    EngineRun,
    Environment,
    Ratio,
    Results,
    SuiteRuns,
    Summary,
    TargetResult,
)

PCIE_GEN5_X16_BYTES_PER_S = 64e9
QUANTILES = {"p10": 0.1, "q1": 0.25, "median": 0.5, "q3": 0.75, "p90": 0.9}


def summarize(samples: npt.ArrayLike, scale: float = 1.0) -> Summary:
    """Median, p10/p90, quartiles and range of the samples times `scale` (s -> us: 1e6)."""
    values = np.asarray(samples, dtype=float) * scale
    if values.size == 0 or not np.isfinite(values).all():
        raise UsageError(f"cannot summarize {values.size} samples with non-finite or none")
    q = dict(zip(QUANTILES, np.quantile(values, list(QUANTILES.values())).tolist(), strict=True))
    low, high = float(values.min()), float(values.max())
    return Summary(n=values.size, min=low, max=high, iqr=q["q3"] - q["q1"], **q)


def ratio_of_medians(numerator: Summary, denominator: Summary) -> Ratio:
    num, den = numerator.median, denominator.median
    if den <= 0:
        raise UsageError(f"ratio: denominator median {den} leaves nothing to divide")
    return Ratio(value=num / den, numerator_median=num, denominator_median=den)


def paired_ratio(numerator: npt.ArrayLike, denominator: npt.ArrayLike) -> Ratio:
    """Ratio of medians, plus the summary of the per-iteration ratios."""
    num, den = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if num.shape != den.shape:
        raise UsageError(f"paired samples differ in length: {num.size} vs {den.size}")
    if (den <= 0).any():
        raise UsageError("paired ratio: a denominator sample is <= 0")
    base = ratio_of_medians(summarize(num), summarize(den))
    return base.model_copy(update={"paired": summarize(num / den)})


def bus_bytes(size: int, world: int) -> float:
    """Bytes a ring moves per link for a collective of `size` bytes over `world` ranks."""
    if world < 1:
        raise UsageError(f"no bus bytes at world size {world}")
    return size * (world - 1) / world


def bandwidth(op: str, nbytes: float, seconds: float) -> Bandwidth:
    if seconds <= 0:
        raise UsageError(f"bandwidth of {op}: time must be > 0, got {seconds}")
    rate = nbytes / seconds
    fraction = rate / PCIE_GEN5_X16_BYTES_PER_S
    return Bandwidth(
        op=op,
        bus_bytes=nbytes,
        seconds=seconds,
        busbw_gb_s=rate / 1e9,
        pcie_gen5_x16_fraction=fraction,
    )


Outcome = Literal["pass", "miss", "not-measured"]
# What a target reads from its section: the measured value and its detail; None: no section.
Reading = tuple[float | None, str] | None


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
        outcome: Outcome = "not-measured" if measured is None else "miss" if over else "pass"
        excess = measured / self.threshold - 1.0 if over and measured is not None else None
        value = None if measured is None else float(measured)
        return TargetResult(
            **vars(self), outcome=outcome, measured=value, excess=excess, detail=detail
        )


TRANSPORT = Target("transport_overhead", "transport step vs raw collectives", 1.15, "x")
LAUNCH = Target("suite_vs_bare_launch", "full dcpqual run vs bare torchrun launch", 2.0, "x")
DISCOVERY = Target("discovery_us_per_module", "vendored discovery per module", 10.0, "us")
CAPTURE = Target("capture_overhead_outside_window", "capture machinery, no window open", 2.0, "%")
MEMORY = Target("peak_rss_per_rank", "peak RSS of a rank during the suites", 400.0, "MB")
REAL_MEMORY = Target(
    "peak_rss_per_rank_real", "peak RSS of a rank during the suites on real trees", 1.2, "GiB"
)
REAL_LAUNCH = Target(
    "real_vs_bare_real_launch",
    "dcpqual run on real trees vs bare torchrun that imports vLLM and builds them",
    1.5,
    "x",
)
ENGINE_LAUNCH = Target(
    "engine_run_s", "dcpqual run --models engine, 2 ranks, wall (vLLM engine per rank)", 90.0, "s"
)
ENGINE_MEMORY = Target(
    "peak_rss_per_rank_engine", "peak RSS of a rank in the engine lane (its record)", 1.5, "GiB"
)
TARGETS = (
    TRANSPORT,
    LAUNCH,
    DISCOVERY,
    CAPTURE,
    MEMORY,
    REAL_MEMORY,
    REAL_LAUNCH,
    ENGINE_LAUNCH,
    ENGINE_MEMORY,
)


def _spread(s: Summary, fmt: str = ".0f") -> str:
    return f"{s.median:{fmt}} [{s.p10:{fmt}}-{s.p90:{fmt}}]"


def _memory(run: SuiteRuns | None, gib: bool) -> Reading:
    if run is None:
        return None
    if run.peak_rss_mb is None:
        return None, "no rank reported its peak RSS"
    per_rank = run.peak_rss_mb_per_rank
    worst = max(per_rank, key=per_rank.__getitem__)
    value = run.peak_rss_gib if gib else run.peak_rss_mb
    return value, f"rank {worst} of {len(per_rank)} ({run.models}, ru_maxrss)"


def _seconds(s: Summary | None) -> str:
    return "-" if s is None else f"{s.median:.1f}"


def _real_launch(run: SuiteRuns | None) -> Reading:
    """The real run against its bare real-tree launch, each side's vLLM split beside it."""
    if run is None:
        return None
    if run.ratio is None or run.bare_launch_s is None:
        return None, "no bare real-tree launch"
    codes = ",".join(map(str, run.suite_exit_codes))
    full, bare = _spread(run.full_suite_s, ".1f"), _spread(run.bare_launch_s, ".1f")
    detail = (
        f"full {full} s vs bare {bare} s, {run.world_size} ranks, exit {codes}; "
        f"{'; '.join(run.real_trees) or 'no tree recorded'}; per rank import/build: bare "
        f"{_seconds(run.bare_real_import_s)}/{_seconds(run.bare_real_build_s)} s, run "
        f"{_seconds(run.real_import_s)}/{_seconds(run.real_build_s)} s"
    )
    if run.forkserver_preload_s is not None:
        preload_s = run.forkserver_preload_s
        detail += f" (its forkserver preloaded vLLM for all ranks in {preload_s:.1f} s)"
    if run.bare_forkserver_launch_s is not None and run.ratio_to_forkserver_launch is not None:
        forked = _spread(run.bare_forkserver_launch_s, ".1f")
        ratio = run.ratio_to_forkserver_launch.value
        detail += (
            "; the cold bare launch imports vLLM once per rank, the run once: bare through the "
            f"forkserver (vLLM preloaded) {forked} s ({ratio:.2f}x of it)"
        )
    return run.ratio.value, detail


def _per_rank(values: Mapping[str, float]) -> str:
    return ", ".join(f"{rank} {v:.1f}" for rank, v in values.items()) or "none"


def _engine(run: EngineRun | None) -> tuple[Reading, Reading]:
    """The engine run's wall time and its worst rank's peak RSS, each with the per-rank engine
    build seconds its record holds; a rank without an engine record leaves the RSS unmeasured."""
    if run is None:
        return None, None
    served = ", ".join(run.models) or "no engine recorded"
    builds = (
        f"engine build per rank {_per_rank(run.build_s_per_rank)} s "
        f"(eager {_per_rank(run.eager_build_s_per_rank)} s)"
    )
    wall = f"{run.world_size} {run.backend} ranks, exit {run.exit_code}, {served}; {builds}"
    rss = run.peak_rss_mib_per_rank
    if run.peak_rss_gib is None or len(rss) < run.world_size:
        return (run.wall_s, wall), (
            None,
            f"engine records from {len(rss)} of {run.world_size} ranks",
        )
    worst = max(rss, key=rss.__getitem__)
    memory = f"rank {worst} of {len(rss)} ({served}; the engine record's peak RSS)"
    return (run.wall_s, wall), (run.peak_rss_gib, memory)


def readings(r: Results) -> dict[Target, tuple[str, Reading]]:
    """Each target's section and what it reads there."""
    t, run, d, cap = r.transport, r.launch, r.discovery, r.capture
    transport = launch = discovery = capture = None
    if t is not None and t.cases:
        cases = ", ".join(f"{c.label} {c.ratio.value:.2f}" for c in t.cases)
        detail = f"worst {t.worst.label} at {t.world_size} {t.backend} ranks; {cases}"
        transport = t.worst.ratio.value, detail
    if run is not None and run.ratio is not None and run.bare_launch_s is not None:
        full, bare = _spread(run.full_suite_s, ".1f"), _spread(run.bare_launch_s, ".1f")
        codes = ",".join(map(str, run.suite_exit_codes))
        detail = f"full {full} s vs bare {bare} s, {run.world_size} ranks, exit {codes}"
        if run.bare_forkserver_launch_s is not None and run.ratio_to_forkserver_launch is not None:
            forked = _spread(run.bare_forkserver_launch_s, ".1f")
            detail += (
                f"; bare through the forkserver {forked} s"
                f" ({run.ratio_to_forkserver_launch.value:.2f}x of it)"
            )
        launch = run.ratio.value, detail
    if d is not None:
        detail = f"{_spread(d.us_per_module, '.2f')} us, {d.modules} modules ({d.layers} layers)"
        discovery = d.us_per_module.median, detail
    if cap is not None:
        detail = f"eager step {cap.strategy} B={cap.batch} {_spread(cap.step_us['plain'])} us"
        if (lookup := cap.lookup_ratio.get("after_window")) is not None:
            detail += f"; registry get {(lookup.value - 1) * 100:+.1f}%"
        capture = cap.overhead_pct, detail
    engine_wall, engine_memory = _engine(r.engine)
    return {
        TRANSPORT: ("transport", transport),
        LAUNCH: ("launch", launch),
        DISCOVERY: ("discovery", discovery),
        CAPTURE: ("capture", capture),
        MEMORY: ("launch", _memory(r.launch, gib=False)),
        REAL_MEMORY: ("real", _memory(r.real, gib=True)),
        REAL_LAUNCH: ("real", _real_launch(r.real)),
        ENGINE_LAUNCH: ("engine", engine_wall),
        ENGINE_MEMORY: ("engine", engine_memory),
    }


def evaluate_targets(r: Results, missing: Mapping[str, str]) -> tuple[TargetResult, ...]:
    """Each target from its section; a missing section gives `not-measured` with the reason."""
    return tuple(
        target.evaluate(*reading)
        if reading is not None
        else target.evaluate(None, missing.get(section, f"{section} not measured"))
        for target, (section, reading) in readings(r).items()
    )


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
    engine_failed = results.engine is not None and results.engine.exit_code != 0
    return BenchReport(
        created_at=created_at,
        environment=environment,
        options=options,
        results=results,
        missing=dict(missing),
        targets=evaluate_targets(results, missing),
        complete=not failed
        and not engine_failed
        and not any(any(run.suite_exit_codes) for run in runs),
        notes=tuple(notes),
    )


def write_report(report: BenchReport, path: Path) -> None:
    """Write the JSON atomically; refuses to overwrite (results are evidence)."""
    if path.exists():
        raise UsageError(f"{path} already exists; bench results are never overwritten")
    atomic_write_text(path, report.model_dump_json(by_alias=True, indent=2) + "\n")


def _table(title: str, *columns: str, rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 or col in ("outcome", "detail") else "right")
    for row in rows:
        table.add_row(*row)
    return table


def print_report(report: BenchReport, stream: TextIO | None = None) -> None:
    console = Console(file=stream, width=160, soft_wrap=False)
    for run in (report.results.launch, report.results.real):
        if run is None or (p := run.profile) is None:
            continue
        phases = [
            ("launcher, torchrun, python + pytest start", f"{p.launcher_before_ranks_s:.1f}", ""),
            *((name, f"{v.median:.1f}", f"{v.max:.1f}") for name, v in p.phases_s.items()),
            ("ranks (probe loaded -> pytest done)", f"{p.ranks_s:.1f}", ""),
            ("rank exit, bundle written and verified", f"{p.launcher_after_ranks_s:.1f}", ""),
        ]
        title = (
            f"Profile: full dcpqual run ({run.models}, {run.world_size} ranks, "
            f"{run.full_suite_s.median:.1f} s wall, {p.cpu_s_all_ranks:.0f} CPU-s), seconds"
        )
        console.print(_table(title, "phase", "median rank", "slowest rank", rows=phases))
    style = {"pass": "green", "miss": "red", "not-measured": "yellow"}
    rows = []
    for r in report.targets:
        outcome = r.outcome if r.excess is None else f"miss (+{r.excess:.0%})"
        measured = "-" if r.measured is None else f"{r.measured:.2f}"
        bound = f"<= {r.threshold:g} {r.unit}"
        rows.append((r.key, measured, bound, f"[{style[r.outcome]}]{outcome}[/]", r.detail))
    columns = ("target", "measured", "bound", "outcome", "detail")
    console.print(_table("Targets (measured, not asserted)", *columns, rows=rows))
    for section, why in report.missing.items():
        console.print(f"{section}: {why}", markup=False)
    for note in report.notes:
        console.print(f"note: {note}", markup=False)
