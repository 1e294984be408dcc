"""`dcpqual bench` as a pipeline: validate options -> measure each section in one session ->
build the report -> write JSON -> print tables.

Sections run one after another on the same machine in the same invocation, so the ratios
compare things measured under the same conditions. A section that fails is recorded as failed
(its targets `not-measured`) and the others still run; the exit code is 1 then. Options that
cannot work here (NCCL without GPUs, an existing output file) stop before anything runs.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from harness.bench.discovery_bench import DiscoveryResult, measure_discovery
from harness.bench.launch_bench import (
    LaunchResult,
    child_env,
    measure_launch,
    rank_log_tail,
    run_timed,
    torchrun_command,
)
from harness.bench.rank_env import BACKENDS, nccl_unavailable_reason
from harness.bench.rank_results import (
    CaptureOverhead,
    TransportResults,
    capture_overhead,
    transport_results,
)
from harness.bench.rank_transport import KIMI_HEADS
from harness.bench.report import BenchReport, print_report, write_report
from harness.bench.targets import SECTIONS
from harness.errors import QualificationError, UsageError
from harness.launch.plan import REPO_ROOT
from harness.transport.torch_backend import STRATEGIES


@dataclass(frozen=True)
class BenchOptions:
    """Every knob of one bench run; defaults are the issue's sizes. Validated here."""

    out: Path
    backend: str = "gloo"
    nproc: int = 16
    batches: tuple[int, ...] = (1, 8, 64)
    strategies: tuple[str, ...] = ("ag_rs", "a2a")
    warmup: int = 5
    iters: int = 50
    capture_batch: int = 8
    capture_iters: int = 200
    lookup_rounds: int = 21
    lookup_loops: int = 2000
    modules: int = 100_000
    discovery_repeats: int = 7
    bare_repeats: int = 3
    suite_repeats: int = 1
    skip: frozenset[str] = field(default_factory=frozenset)
    timeout_s: float = 3600.0
    quick: bool = False
    keep_work: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise UsageError(f"unknown --backend {self.backend!r}; expected one of {BACKENDS}")
        if self.nproc < 1 or KIMI_HEADS % self.nproc:
            raise UsageError(
                f"--nproc-per-node {self.nproc}: the Kimi-K3 geometry needs a rank count that "
                f"divides its {KIMI_HEADS} heads"
            )
        if not self.batches or any(b < 1 for b in self.batches):
            raise UsageError(f"--batches must be positive integers, got {list(self.batches)}")
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if not self.strategies or bad:
            raise UsageError(f"--strategies must be from {STRATEGIES}, got {list(self.strategies)}")
        unknown = sorted(self.skip - set(SECTIONS))
        if unknown:
            raise UsageError(f"--skip: unknown section(s) {unknown}; sections are {SECTIONS}")
        positive = (
            "iters", "capture_batch", "capture_iters", "lookup_rounds", "lookup_loops",
            "modules", "discovery_repeats", "bare_repeats", "suite_repeats",
        )  # fmt: skip
        for name in positive:
            if getattr(self, name) < 1:
                raise UsageError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        if self.warmup < 0 or not self.timeout_s > 0:
            raise UsageError(
                f"--warmup must be >= 0 and --timeout > 0, got {self.warmup}, {self.timeout_s}"
            )

    def wants(self, section: str) -> bool:
        return section not in self.skip

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["out"] = str(self.out)
        data["skip"] = sorted(self.skip)
        data["batches"], data["strategies"] = list(self.batches), list(self.strategies)
        return data


# Smoke sizes: 2 ranks, few iterations, a small model. Explicit options still win.
QUICK: dict[str, Any] = {
    "nproc": 2,
    "batches": (1, 8),
    "warmup": 1,
    "iters": 5,
    "capture_iters": 20,
    "lookup_rounds": 5,
    "lookup_loops": 200,
    "modules": 5000,
    "discovery_repeats": 3,
    "bare_repeats": 1,
    "suite_repeats": 1,
}


def with_quick(options: BenchOptions, explicit: set[str]) -> BenchOptions:
    """The quick preset over `options`, except for the knobs the user set explicitly."""
    return replace(options, quick=True, **{k: v for k, v in QUICK.items() if k not in explicit})


def check_backend(options: BenchOptions) -> None:
    """Fail closed before measuring anything when the backend cannot run here."""
    if options.backend == "nccl":
        reason = nccl_unavailable_reason(options.nproc)
        if reason is not None:
            raise UsageError(f"{reason}; the NCCL transport measurement runs on the GPU node")


def environment() -> dict[str, Any]:
    import torch

    from harness.image.gitinfo import identity

    try:
        source: Any = identity(REPO_ROOT).to_json()
    except UsageError as exc:
        source = {"error": str(exc)}
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "loadavg_start": list(os.getloadavg()),
        "source": source,
    }


def rank_job(options: BenchOptions, work: Path) -> dict[str, Any]:
    """Transport and capture sections in one torchrun launch; the ranks' raw samples."""
    out, logs = work / "ranks.json", work / "ranks"
    argv = [
        *torchrun_command(options.nproc, options.backend, logs),
        "-m", "harness.bench.rank",
        f"--out={out}", f"--backend={options.backend}",
        f"--strategies={','.join(options.strategies)}",
        f"--batches={','.join(map(str, options.batches))}",
        f"--warmup={options.warmup}", f"--iters={options.iters}",
        f"--capture-batch={options.capture_batch}", f"--capture-iters={options.capture_iters}",
        f"--lookup-rounds={options.lookup_rounds}", f"--lookup-loops={options.lookup_loops}",
    ]  # fmt: skip
    if not options.wants("transport"):
        argv.append("--skip-transport")
    if options.wants("capture"):
        argv.append("--capture")
    _, code = run_timed(argv, child_env(), logs / "agent.log", options.timeout_s)
    tail = rank_log_tail(logs)
    if code != 0 or not out.exists():
        what = "cannot run this backend" if "harness.bench.rank:" in tail else "failed"
        raise QualificationError(f"bench ranks {what} (torchrun exit {code}); {tail}")
    results: dict[str, Any] = json.loads(out.read_text())
    return results


@dataclass
class Collected:
    transport: TransportResults | None = None
    capture: CaptureOverhead | None = None
    discovery: DiscoveryResult | None = None
    launch: LaunchResult | None = None
    why_missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _section(
    collected: Collected, names: tuple[str, ...], say: Callable[[str], None], fn: Callable[[], None]
) -> None:
    """Run one measurement; a failure marks its sections failed and the bench goes on."""
    t0 = time.perf_counter()
    say(f"dcpqual bench: {' + '.join(names)} ...")
    try:
        fn()
    except Exception as exc:  # one broken section must not lose the others' numbers
        for name in names:
            collected.why_missing[name] = f"failed: {type(exc).__name__}: {exc}"
        say(f"dcpqual bench: {' + '.join(names)} failed: {exc}")
        return
    say(f"dcpqual bench: {' + '.join(names)} done in {time.perf_counter() - t0:.1f}s")


def measure(options: BenchOptions, work: Path, say: Callable[[str], None]) -> Collected:
    got = Collected()
    for name in sorted(options.skip):
        got.why_missing[name] = f"skipped (--skip {name})"

    if options.wants("discovery"):

        def discovery() -> None:
            got.discovery = measure_discovery(options.modules, options.discovery_repeats)

        _section(got, ("discovery",), say, discovery)

    rank_sections = tuple(s for s in ("transport", "capture") if options.wants(s))
    if rank_sections:

        def ranks() -> None:
            raw = rank_job(options, work)
            if options.wants("transport"):
                got.transport = transport_results(raw)
            if options.wants("capture"):
                got.capture = capture_overhead(raw)
                if got.capture.unavailable:
                    got.notes.append(f"capture: {got.capture.unavailable}")

        _section(got, rank_sections, say, ranks)

    if options.wants("launch"):

        def launch() -> None:
            got.launch = measure_launch(
                options.nproc,
                options.backend,
                work / "launch",
                bare_repeats=options.bare_repeats,
                suite_repeats=options.suite_repeats,
                timeout_s=options.timeout_s,
                say=say,
            )
            failed = [c for c in got.launch.suite_exit_codes if c]
            if failed:
                got.notes.append(
                    f"launch: {len(failed)} suite run(s) did not pass (exit {failed}); the time "
                    "and RSS are those of a failing run"
                )

        _section(got, ("launch",), say, launch)
    return got


def run_bench(options: BenchOptions, stream: TextIO | None = None) -> int:
    stream = sys.stdout if stream is None else stream

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    check_backend(options)
    if options.out.exists():
        raise UsageError(f"{options.out} already exists; bench results are never overwritten")
    env = environment()
    created = datetime.now(UTC).isoformat(timespec="seconds")
    work = Path(tempfile.mkdtemp(prefix="dcpqual-bench-"))
    got = measure(options, work, say)
    env["loadavg_end"] = list(os.getloadavg())
    if options.quick:
        got.notes.append("--quick: smoke sizes, not the issue's geometry; numbers are not results")
    report = BenchReport(
        created_at=created,
        environment=env,
        options=options.to_json(),
        transport=got.transport,
        capture=got.capture,
        discovery=got.discovery,
        launch=got.launch,
        why_missing=got.why_missing,
        notes=tuple(got.notes),
    )
    write_report(report, options.out)
    print_report(report, stream)
    if options.keep_work or not report.complete:
        say(f"dcpqual bench: work files kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    say(f"dcpqual bench: results -> {options.out}")
    return 0 if report.complete else 1
