"""Launching for the bench: every torchrun goes through `harness.launch` (its flags, its process
tree, its timeout), and a launch that fails names the rank that died and how.

Measured here: the full `dcpqual run` of all suites (a subprocess, timed as the person waiting
sees it) against a bare launch of the same size (join the group, one all-reduce), alternating
so load drift hits both; each full run's ranks carry the probe plugin (peak RSS, CPU, phases).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.bench.probe import ENV_DIR, ENV_PROFILE
from harness.bench.stats import Ratio, Summary, ratio_of_medians, summarize
from harness.errors import QualificationError
from harness.launch.launcher import launch
from harness.launch.plan import REPO_ROOT, RunOptions, RunPlan, torchrun_args
from harness.launch.ranklogs import torchrun_logs

MB, GIB = 1e6, float(1 << 30)
# torchrun's failure table: "rank : 1 (local_rank: 1)" then "exitcode : -6 (pid: ...)".
_FAILURE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)\s*exitcode\s*:\s*(-?\d+)")


def dead_ranks(agent_log: str) -> list[tuple[int, int, int]]:
    """(rank, local rank, exit code) of each failed rank torchrun reports, root cause first."""
    failures, _, root = agent_log.rpartition("Root Cause")
    found = [tuple(map(int, m)) for m in _FAILURE.findall(root)]
    found += [f for f in (tuple(map(int, m)) for m in _FAILURE.findall(failures)) if f not in found]
    return found  # type: ignore[return-value]


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"exit {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exit {code}"


def why_failed(out_dir: Path, code: int, world: int, lines: int = 8) -> str:
    """One paragraph: which rank died first and how, and the end of its stderr."""
    agent = out_dir / "torchrun" / "node-00" / "agent.log"
    text = agent.read_text(errors="replace") if agent.is_file() else ""
    stderr = {log.local_rank: log.path for log in torchrun_logs(out_dir) if log.stream == "stderr"}
    dead = dead_ranks(text)
    if not dead:
        tails = [p for p in stderr.values() if p.read_text(errors="replace").strip()]
        where = f"; {tails[0]}:\n" + _tail(tails[0], lines) if tails else ""
        return f"torchrun exit {code}, no failed rank in its report ({agent}){where}"
    rank, local, rc = dead[0]
    others = ", ".join(f"rank {r} {_exit_text(c)}" for r, _, c in dead[1:])
    head = f"bench rank {rank} of {world} died first ({_exit_text(rc)}; torchrun exit {code})"
    head += f"; then {others}" if others else ""
    path = stderr.get(local)
    return head + (f"; its stderr ({path}) ends:\n{_tail(path, lines)}" if path else "")


def _tail(path: Path, lines: int) -> str:
    text = path.read_text(errors="replace").strip()
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


def bench_plan(
    nproc: int, backend: str, out_dir: Path, module_args: Sequence[str], timeout_s: float
) -> RunPlan:
    """A torchrun of `python -m MODULE ARGS` with `dcpqual run`'s own flags and environment."""
    options = RunOptions(
        nproc_per_node=nproc, backend=backend, tp=nproc, dcp=nproc, timeout_s=timeout_s
    )
    probe = RunPlan(options, out_dir, ())
    argv = (*torchrun_args(options, probe.log_dir), "-m", *module_args)
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return RunPlan(options, out_dir, argv, env={"PYTHONPATH": path, "PYTHONUNBUFFERED": "1"})


def run_ranks(
    nproc: int, backend: str, out_dir: Path, module_args: Sequence[str], timeout_s: float
) -> float:
    """Launch once; seconds it took. A failed launch raises with the dead rank named."""
    result = launch(bench_plan(nproc, backend, out_dir, module_args, timeout_s))
    if result.timed_out:
        raise QualificationError(f"{module_args[0]} ranks ran past {timeout_s:g}s; see {out_dir}")
    if result.exit_code != 0:
        raise QualificationError(why_failed(out_dir, result.exit_code, nproc))
    return result.elapsed_s


@dataclass(frozen=True)
class LaunchResult:
    """Full suite runs (and, for the stand-ins, bare launches), with each rank's peak RSS."""

    world_size: int
    backend: str
    models: str
    bare_launch_s: Summary | None
    full_suite_s: Summary
    ratio: Ratio | None  # full / bare, medians
    suite_exit_codes: tuple[int, ...]
    peak_rss_mb_per_rank: Mapping[str, float]  # rank -> max over the runs, MB (1e6 bytes)
    peak_rss_mb: float | None
    peak_rss_gib: float | None
    cpu_s_per_rank: Mapping[str, float]  # rank -> CPU seconds of its last run
    profile: Mapping[str, Any] | None  # phase breakdown of the last run (with --profile)


def read_probes(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("rank-*.json"))]


def profile_of(
    probes: Sequence[Mapping[str, Any]], started: float, ended: float
) -> dict[str, Any] | None:
    """Per phase, the median and max over ranks (seconds); the launcher's share around them."""
    phased = [p for p in probes if "phases" in p]
    if not phased:
        return None
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(float(value))

    for p in phased:
        ph = p["phases"]
        for name in ("import_torch", "configure", "collection", "finish"):
            add(name, ph[name])
        for suite, values in ph["suites"].items():
            tests = int(values.get("tests", 0))
            for key, value in values.items():
                if key != "tests":
                    add(f"suite {suite} ({tests} tests): {key}", value)
        add("rank CPU seconds", p["cpu_s"])
    phases = {k: {"median": float(np.median(v)), "max": max(v)} for k, v in rows.items()}
    first, last = min(p["loaded_at"] for p in phased), max(p["ended_at"] for p in phased)
    return {
        "ranks": len(phased),
        "phases_s": phases,
        "launcher_before_ranks_s": first - started,  # launcher start, torchrun, python + pytest
        "ranks_s": last - first,
        "launcher_after_ranks_s": ended - last,  # rank exit, bundle written and verified
        "cpu_s_all_ranks": sum(p["cpu_s"] for p in phased),
        "unprobed": sorted({u for p in phased for u in p["phases"]["unprobed"]}),
    }


def full_run(
    nproc: int, backend: str, models: str, work: Path, timeout_s: float, profile: bool
) -> tuple[float, int, list[dict[str, Any]], dict[str, Any] | None]:
    """One real `dcpqual run` into a scratch folder; seconds, exit code, probes, profile."""
    probes = work / "probe"
    addopts = " ".join(filter(None, (os.environ.get("PYTEST_ADDOPTS"), "-p harness.bench.probe")))
    env = {**os.environ, ENV_DIR: str(probes), "PYTEST_ADDOPTS": addopts}
    env[ENV_PROFILE] = "1" if profile else "0"
    flags: dict[str, object] = {"nproc-per-node": nproc, "backend": backend, "models": models}
    flags.update({"out": work / "bundle", "timeout": f"{timeout_s:g}"})
    argv = [sys.executable, "-m", "harness", "run", *(f"--{k}={v}" for k, v in flags.items())]
    work.mkdir(parents=True, exist_ok=True)
    started, limit = time.time(), timeout_s + 120
    with (work / "run.log").open("wb") as log:
        try:
            done = subprocess.run(argv, env=env, stdout=log, stderr=log, timeout=limit, check=False)
        except subprocess.TimeoutExpired:
            raise QualificationError(f"dcpqual run ran past {limit:g}s; see {work}") from None
    ended = time.time()
    found = read_probes(probes)
    return ended - started, done.returncode, found, profile_of(found, started, ended)


def measure_launch(
    nproc: int,
    backend: str,
    work: Path,
    *,
    models: str = "stand-in",
    bare_repeats: int = 0,
    suite_repeats: int = 1,
    timeout_s: float = 3600.0,
    profile: bool = False,
    say: Callable[[str], None] = print,
) -> LaunchResult:
    bare: list[float] = []
    suite: list[float] = []
    codes: list[int] = []
    rss: dict[str, float] = {}
    cpu: dict[str, float] = {}
    prof = None
    for i in range(max(bare_repeats, suite_repeats)):
        if i < bare_repeats:
            bare.append(
                run_ranks(
                    nproc,
                    backend,
                    work / f"bare-{i}",
                    ("harness.bench.bare_rank", backend),
                    timeout_s,
                )
            )
            say(f"  bare launch {i + 1}/{bare_repeats}: {bare[-1]:.1f}s")
        if i < suite_repeats:
            seconds, code, probes, prof = full_run(
                nproc, backend, models, work / f"suite-{i}", timeout_s, profile
            )
            suite.append(seconds)
            codes.append(code)
            for p in probes:
                key = str(p["rank"])
                rss[key] = max(p["ru_maxrss_kib"] * 1024 / MB, rss.get(key, 0.0))
                cpu[key] = p["cpu_s"]
            say(f"  full run ({models}) {i + 1}/{suite_repeats}: {seconds:.1f}s (exit {code})")
    peak = max(rss.values()) if rss else None
    bare_s, suite_s = (summarize(bare) if bare else None), summarize(suite)
    return LaunchResult(
        world_size=nproc,
        backend=backend,
        models=models,
        bare_launch_s=bare_s,
        full_suite_s=suite_s,
        ratio=None if bare_s is None else ratio_of_medians(suite_s, bare_s),
        suite_exit_codes=tuple(codes),
        peak_rss_mb_per_rank=dict(sorted(rss.items(), key=lambda kv: int(kv[0]))),
        peak_rss_mb=peak,
        peak_rss_gib=None if peak is None else peak * MB / GIB,
        cpu_s_per_rank=cpu,
        profile=prof,
    )
