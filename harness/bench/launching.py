"""Launching for the bench: every torchrun goes through `harness.launch` (its flags, its process
tree, its timeout), and a launch that fails names the rank that died first and how.

Measured here: the full `dcpqual run` of all suites (a subprocess, timed as the person waiting
sees it) against a bare launch of the same size (join the group, one all-reduce), alternating
so load drift hits both; each full run's ranks carry the probe plugin (peak RSS, CPU, phases).
The run on real trees is compared with a bare launch whose ranks import vLLM and build the same
trees (`harness.bench.bare_real_rank`), and each side's vLLM cost is split into import and build.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from harness.bench.bare_real_rank import read_records
from harness.bench.probe import ENV_DIR, ENV_PROFILE
from harness.bench.report import ratio_of_medians, summarize
from harness.errors import QualificationError
from harness.launch.agent import agent_argv, cold_reason
from harness.launch.launcher import launch
from harness.launch.plan import REPO_ROOT, RunOptions, RunPlan, rank_plan, torchrun_args
from harness.launch.ranklogs import torchrun_logs
from harness.rank.forkserver_preload import preload_seconds
from harness.rank.preload import PRELOAD, preload_for
from harness.schema.bench import (
    BenchOptions,
    EngineRun,
    ProbeRecord,
    Profile,
    Spread,
    SuiteRuns,
    Summary,
)
from harness.schema.layout import RECORDS_DIR, TORCHRUN_DIR, node_dir_name
from harness.schema.rank_record import EngineRecord, RankRecord, RealTreeRecord

MB, GIB, MIB = 1e6, float(1 << 30), float(1 << 20)
ENGINE_NPROC = 2  # the engine lane's run: one vLLM engine per rank, TP2/DCP2
# torchrun's failure table: "rank : 1 (local_rank: 1)" then "exitcode : -6 (pid: ...)".
_FAILURE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)\s*exitcode\s*:\s*(-?\d+)")


def dead_ranks(agent_log: str) -> list[tuple[int, int, int]]:
    """(rank, local rank, exit code) of each failed rank torchrun reports, root cause first."""
    failures, _, root = agent_log.rpartition("Root Cause")
    found: list[tuple[int, int, int]] = []
    for text in (root, failures):
        for r, local, code in _FAILURE.findall(text):
            if (entry := (int(r), int(local), int(code))) not in found:
                found.append(entry)
    return found


def _exit_text(code: int) -> str:
    names = {-s.value: s.name for s in signal.Signals}
    return f"exit {code} ({names[code]})" if code in names else f"exit {code}"


def _tail(path: Path, lines: int = 8) -> str:
    return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) or "(empty)"


def why_failed(out_dir: Path, code: int, world: int) -> str:
    """One paragraph: which rank died first and how, and the end of its stderr."""
    agent = out_dir / TORCHRUN_DIR / node_dir_name(0) / "agent.log"
    dead = dead_ranks(agent.read_text(errors="replace") if agent.is_file() else "")
    stderr = {log.local_rank: log.path for log in torchrun_logs(out_dir) if log.stream == "stderr"}
    if not dead:
        said = [p for p in stderr.values() if p.read_text(errors="replace").strip()]
        where = f"; {said[0]}:\n{_tail(said[0])}" if said else ""
        return f"torchrun exit {code}, no failed rank in its report ({agent}){where}"
    (rank, local, rc), others = dead[0], dead[1:]
    text = f"bench rank {rank} of {world} died first ({_exit_text(rc)}; torchrun exit {code})"
    if others:
        text += "; then " + ", ".join(f"rank {r} {_exit_text(c)}" for r, _, c in others)
    path = stderr.get(local)
    return text + (f"; its stderr ({path}) ends:\n{_tail(path)}" if path else "")


def run_ranks(
    nproc: int,
    backend: str,
    out_dir: Path,
    module_args: Sequence[str],
    timeout_s: float,
    *,
    start: RankStart = "cold",
    preload: tuple[str, ...] = PRELOAD,
    extra_env: Mapping[str, str] | None = None,
) -> float:
    """Launch `python -m MODULE ARGS` once with `dcpqual run`'s own torchrun flags and
    environment, its ranks started by `start` (cold by torchrun, or as `dcpqual run` starts
    them: by torchelastic's agent from multiprocessing's forkserver, with `preload`);
    `extra_env` for the ranks besides. Seconds it took; a failed launch raises with
    the dead rank named."""
    options = RunOptions(
        nproc_per_node=nproc, backend=backend, tp=nproc, dcp=nproc, timeout_s=timeout_s
    )
    log_dir = RunPlan(options, out_dir, ()).log_dir
    rank_argv = ("-m", *module_args)
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**(extra_env or {}), "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    torchrun = torchrun_args(options, log_dir)
    if start == "cold":
        plan = RunPlan(options, out_dir, (*torchrun, *rank_argv), env=env)
    else:
        plan = RunPlan(options, out_dir, agent_argv(torchrun, rank_argv, preload), env=env)
    result = launch(plan)
    if result.timed_out:
        raise QualificationError(f"{module_args[0]} ranks ran past {timeout_s:g}s; see {out_dir}")
    if result.exit_code != 0:
        raise QualificationError(why_failed(out_dir, result.exit_code, nproc))
    return result.elapsed_s


RankStart = Literal["cold", "forkserver"]


def read_probes(folder: Path) -> list[ProbeRecord]:
    return [
        ProbeRecord.model_validate_json(p.read_text()) for p in sorted(folder.glob("rank-*.json"))
    ]


def profile_of(probes: Sequence[ProbeRecord], started: float, ended: float) -> Profile | None:
    """Per phase, the median and slowest rank (seconds); the launcher's share around the ranks."""
    phased = [(p, p.phases) for p in probes if p.phases is not None]
    if not phased:
        return None
    rows: dict[str, list[float]] = {}
    for p, ph in phased:
        named = ph.model_dump(include={"import_torch", "configure", "collection", "finish"})
        for suite, values in ph.suites.items():
            label = f"suite {suite} ({int(values.get('tests', 0))} tests)"
            named.update({f"{label}: {k}": v for k, v in values.items() if k != "tests"})
        named["rank CPU seconds"] = p.cpu_s
        for name, value in named.items():
            rows.setdefault(name, []).append(float(value))
    first, last = min(p.loaded_at for p, _ in phased), max(p.ended_at for p, _ in phased)
    return Profile(
        ranks=len(phased),
        phases_s={k: Spread(median=float(np.median(v)), max=max(v)) for k, v in rows.items()},
        launcher_before_ranks_s=first - started,
        ranks_s=last - first,
        launcher_after_ranks_s=ended - last,
        cpu_s_all_ranks=sum(p.cpu_s for p, _ in phased),
        unprobed=tuple(sorted({u for _, ph in phased for u in ph.unprobed})),
    )


@dataclass(frozen=True)
class FullRun:
    """One full `dcpqual run` as the bench saw it: wall seconds, exit code, each rank's probe."""

    seconds: float
    exit_code: int
    probes: list[ProbeRecord]
    profile: Profile | None


def full_run(options: BenchOptions, nproc: int, models: str, work: Path) -> FullRun:
    """One real `dcpqual run` into a scratch folder, timed as the person waiting sees it."""
    probes = work / "probe"
    addopts = " ".join(filter(None, (os.environ.get("PYTEST_ADDOPTS"), "-p harness.bench.probe")))
    env = {**os.environ, ENV_DIR: str(probes), ENV_PROFILE: "1" if options.profile else "0"}
    env["PYTEST_ADDOPTS"] = addopts
    flags = {"nproc-per-node": nproc, "backend": options.backend, "models": models}
    flags.update({"out": str(work / "bundle"), "timeout": f"{options.timeout_s:g}"})
    argv = [sys.executable, "-m", "harness", "run", *(f"--{k}={v}" for k, v in flags.items())]
    work.mkdir(parents=True, exist_ok=True)
    started, limit = time.time(), options.timeout_s + 120
    with (work / "run.log").open("wb") as log:
        try:
            done = subprocess.run(argv, env=env, stdout=log, stderr=log, timeout=limit, check=False)
        except subprocess.TimeoutExpired:
            raise QualificationError(f"dcpqual run ran past {limit:g}s; see {work}") from None
    ended = time.time()
    found = read_probes(probes)
    return FullRun(ended - started, done.returncode, found, profile_of(found, started, ended))


def real_trees(bundle: Path) -> list[RealTreeRecord]:
    """Every real tree the run's ranks built (the bundle's records, in rank order)."""
    return [
        tree
        for path in sorted((bundle / RECORDS_DIR).glob("rank-*.json"))
        for tree in RankRecord.read(path).extra.real_trees
    ]


def engine_records(bundle: Path) -> dict[int, EngineRecord]:
    """Each rank's engine record in the bundle (rank -> record); a rank that built no engine
    is absent."""
    found: dict[int, EngineRecord] = {}
    for path in sorted((bundle / RECORDS_DIR).glob("rank-*.json")):
        record = RankRecord.read(path)
        if (engine := record.extra.engine) is not None:
            found[record.rank] = engine
    return found


def engine_run(seconds: float, exit_code: int, backend: str, bundle: Path) -> EngineRun:
    """The engine lane's row from the run's wall time and its bundle's engine records."""
    records = engine_records(bundle)
    rss = {str(r): e.peak_rss_mib for r, e in sorted(records.items())}
    return EngineRun(
        world_size=ENGINE_NPROC,
        backend=backend,
        wall_s=seconds,
        exit_code=exit_code,
        models=tuple(sorted({e.model for e in records.values()})),
        build_s_per_rank={str(r): e.build_s for r, e in sorted(records.items())},
        eager_build_s_per_rank={str(r): e.eager_build_s for r, e in sorted(records.items())},
        peak_rss_mib_per_rank=rss,
        peak_rss_gib=max(rss.values()) * MIB / GIB if rss else None,
    )


def measure_engine(options: BenchOptions, work: Path, say: Callable[[str], None]) -> EngineRun:
    """One 2-rank `dcpqual run --models engine`, timed; the rest from its rank records."""
    run = full_run(options, ENGINE_NPROC, "engine", work)
    say(f"  engine-lane run: {run.seconds:.1f}s (exit {run.exit_code})")
    return engine_run(run.seconds, run.exit_code, options.backend, work / "bundle")


def configuration(tree: RealTreeRecord) -> str:
    """What identifies the trees built: model, geometry, KV cache dtypes, comm backend."""
    draft = f" draft_kv={tree.draft_kv_cache_dtype}" if tree.draft_kv_cache_dtype else ""
    return (
        f"{tree.model} tp={tree.tp} dcp={tree.dcp} kv={tree.kv_cache_dtype} "
        f"{tree.dcp_comm_backend}{draft}"
    )


def same_trees(run: Sequence[RealTreeRecord], bare: Sequence[RealTreeRecord], world: int) -> None:
    """The bare launch stands beside the run only if its ranks built the trees the run's ranks
    built (configuration, classes, shims; one per rank); QualificationError otherwise."""
    built = Counter(t.configuration() for t in run)
    if len(bare) != world or Counter(t.configuration() for t in bare) != built:
        stood = sorted(set(map(configuration, bare))) or "nothing"
        raise QualificationError(
            f"the bare real-tree launch built {stood} on {len(bare)} of {world} ranks, the run "
            f"{sorted(set(map(configuration, run))) or 'nothing'} on {len(run)}: no ratio "
            "between different work"
        )


def forkserver_preload_s(bundle: Path) -> float | None:
    """Seconds the run's forkserver took to preload (vLLM's import, where a run on real trees
    has it preloaded); None where none said it was done (one rank) or its ranks started cold."""
    log = bundle / TORCHRUN_DIR / node_dir_name(0) / "agent.log"
    if not log.is_file() or cold_reason(log) is not None:
        return None
    return preload_seconds(log.read_text(errors="replace"))


def _split(trees: Sequence[RealTreeRecord]) -> tuple[Summary | None, Summary | None]:
    if not trees:
        return None, None
    return summarize([t.import_s for t in trees]), summarize([t.build_s for t in trees])


def _say_split(say: Callable[[str], None], who: str, trees: Sequence[RealTreeRecord]) -> None:
    if trees:
        imports, builds = [t.import_s for t in trees], [t.build_s for t in trees]
        say(
            f"  vLLM per rank ({who}): import {np.median(imports):.1f}s (max {max(imports):.1f}), "
            f"build {np.median(builds):.1f}s (max {max(builds):.1f})"
        )


def bare_real_launch(
    options: BenchOptions, nproc: int, work: Path, *, start: RankStart = "cold"
) -> tuple[float, list[RealTreeRecord]]:
    """The bare real-tree launch at `nproc` ranks, cold (each rank imports vLLM itself) or
    forked from a forkserver that preloaded vLLM as the real run's does, with the rank plan
    `dcpqual run --models real` gives its ranks; its seconds and trees."""
    run = RunOptions(nproc_per_node=nproc, backend=options.backend, models="real")
    trees = work / "trees"
    trees.mkdir(parents=True, exist_ok=True)
    module = ("harness.bench.bare_real_rank", options.backend, f"{options.timeout_s:g}", str(trees))
    plan = rank_plan(run, work).to_environ()
    seconds = run_ranks(
        nproc,
        options.backend,
        work,
        module,
        options.timeout_s,
        start=start,
        preload=preload_for("real"),
        extra_env=plan,
    )
    return seconds, read_records(trees)


def measure_runs(
    options: BenchOptions, models: str, work: Path, say: Callable[[str], None] = print
) -> SuiteRuns:
    """Full runs of `models` (for the stand-ins alternating with bare launches of the same size);
    each rank's peak RSS over the full runs. The real trees run once, at their own rank count,
    after one bare real-tree launch of that size."""
    real = models == "real"
    nproc, backend = options.real_nproc if real else options.nproc, options.backend
    bare_repeats, suite_repeats = (0, 1) if real else (options.bare_repeats, options.suite_repeats)
    timeout = options.timeout_s
    bare_rank = ("harness.bench.bare_rank", backend, f"{timeout:g}")
    bare: list[float] = []
    # The same bare launch with its ranks started as `dcpqual run` starts them.
    preloaded: list[float] = []
    bare_trees: list[RealTreeRecord] = []
    runs: list[FullRun] = []
    if real:
        seconds, bare_trees = bare_real_launch(options, nproc, work / "bare-real")
        bare.append(seconds)
        say(f"  bare real-tree launch: {seconds:.1f}s")
        _say_split(say, "bare launch", bare_trees)
        if nproc > 1:  # the like-for-like side, as the run's ranks are: vLLM imported once
            seconds, forked_trees = bare_real_launch(
                options, nproc, work / "bare-real-forkserver", start="forkserver"
            )
            preloaded.append(seconds)
            say(f"  bare real-tree launch through the forkserver (vLLM preloaded): {seconds:.1f}s")
            same_trees(bare_trees, forked_trees, nproc)
    for i in range(max(bare_repeats, suite_repeats)):
        if i < bare_repeats:
            bare.append(run_ranks(nproc, backend, work / f"bare-{i}", bare_rank, timeout))
            say(f"  bare launch {i + 1}/{bare_repeats}: {bare[-1]:.1f}s")
            # `dcpqual run` forks its ranks only where there is more than one
            if nproc > 1:
                where = work / f"bare-forkserver-{i}"
                preloaded.append(
                    run_ranks(nproc, backend, where, bare_rank, timeout, start="forkserver")
                )
                through = f"{preloaded[-1]:.1f}s"
                say(f"  bare launch through the forkserver {i + 1}/{bare_repeats}: {through}")
        if i < suite_repeats:
            runs.append(run := full_run(options, nproc, models, work / f"suite-{i}"))
            took = f"{run.seconds:.1f}s (exit {run.exit_code})"
            say(f"  full run ({models}) {i + 1}/{suite_repeats}: {took}")
    bundle = work / "suite-0" / "bundle"
    run_trees = real_trees(bundle) if real else []
    preload_s = forkserver_preload_s(bundle) if real else None
    if real:
        _say_split(say, "full run", run_trees)
        if preload_s is not None:
            say(f"  full run's forkserver preload (vLLM included): {preload_s:.1f}s")
        same_trees(run_trees, bare_trees, nproc)
    rss: dict[int, float] = {}
    for p in (p for run in runs for p in run.probes):
        rss[p.rank] = max(p.ru_maxrss_kib * 1024 / MB, rss.get(p.rank, 0.0))
    peak, last = (max(rss.values()) if rss else None), runs[-1].probes
    bare_s, suite_s = (summarize(bare) if bare else None), summarize([run.seconds for run in runs])
    forkserver_s = summarize(preloaded) if preloaded else None
    run_import, run_build = _split(run_trees)
    bare_import, bare_build = _split(bare_trees)
    return SuiteRuns(
        world_size=nproc,
        backend=backend,
        models=models,
        bare_launch_s=bare_s,
        full_suite_s=suite_s,
        ratio=None if bare_s is None else ratio_of_medians(suite_s, bare_s),
        bare_forkserver_launch_s=forkserver_s,
        ratio_to_forkserver_launch=(
            None if forkserver_s is None else ratio_of_medians(suite_s, forkserver_s)
        ),
        suite_exit_codes=tuple(run.exit_code for run in runs),
        peak_rss_mb_per_rank={str(r): rss[r] for r in sorted(rss)},
        peak_rss_mb=peak,
        peak_rss_gib=None if peak is None else peak * MB / GIB,
        cpu_s_per_rank={str(p.rank): p.cpu_s for p in sorted(last, key=lambda p: p.rank)},
        profile=runs[-1].profile,
        real_import_s=run_import,
        real_build_s=run_build,
        real_trees=tuple(sorted(set(map(configuration, run_trees)))),
        bare_real_import_s=bare_import,
        bare_real_build_s=bare_build,
        forkserver_preload_s=preload_s,
    )
