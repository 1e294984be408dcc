"""Launch cost and memory: the full `dcpqual run` of all suites against a bare torchrun launch.

Both are timed wall clock from the driver, as a person waiting for them would see it. The bare
launch uses the same torchrun flags as `dcpqual run` (`harness.launch.plan.torchrun_args`) and runs
`harness.bench.bare_rank` (join the group, one all-reduce). The two alternate (bare, full, bare,
...) so load drift hits both. The full run gets the RSS plugin through PYTEST_ADDOPTS; each rank
writes its `ru_maxrss` to a folder outside the evidence bundle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.bench.rss_plugin import ENV_DIR
from harness.bench.stats import Ratio, Summary, ratio_of_medians, summarize
from harness.errors import QualificationError
from harness.launch.plan import REPO_ROOT, RunOptions, torchrun_args
from harness.launch.proctree import Tracker

KIB = 1024
SCAN_S = 2.0  # seconds between process-tree scans while a launch runs
MB = 1e6


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's environment plus the repository on PYTHONPATH (as `dcpqual run` does)."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)
    env.update(extra or {})
    return env


def torchrun_command(nproc: int, backend: str, log_dir: Path) -> list[str]:
    """torchrun with `dcpqual run`'s own flags, for `nproc` ranks on this node."""
    options = RunOptions(nproc_per_node=nproc, backend=backend, tp=nproc, dcp=nproc)
    return torchrun_args(options, log_dir)


def rank_log_tail(log_dir: Path, lines: int = 15) -> str:
    """The end of the first rank's non-empty stderr under a torchrun --log-dir, for errors."""
    for path in sorted(log_dir.rglob("stderr.log")):
        text = path.read_text(errors="replace").strip()
        if text:
            return f"{path}:\n" + "\n".join(text.splitlines()[-lines:])
    return f"(no rank stderr under {log_dir})"


def run_timed(
    argv: Sequence[str], env: Mapping[str, str], log: Path, timeout_s: float
) -> tuple[float, int]:
    """Wall seconds and exit code of one command, its output to `log`.

    Past `timeout_s` the whole process tree is ended (ranks included: torchrun puts them in
    sessions of their own, so the tree is tracked, as `dcpqual run` does). The tree is scanned
    every `SCAN_S` only, to keep the watcher's own load off the measurement.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            list(argv), env=dict(env), stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    tracker = Tracker(proc.pid)
    try:
        while True:
            try:
                code = proc.wait(timeout=SCAN_S)
                break
            except subprocess.TimeoutExpired:
                tracker.scan()
            if time.perf_counter() - t0 > timeout_s:
                tracker.end_all(grace_s=15.0)
                proc.wait()
                raise QualificationError(
                    f"{' '.join(map(str, argv[:5]))} ... ran past {timeout_s:g}s; see {log}"
                )
    except BaseException:
        tracker.end_all(grace_s=5.0)
        raise
    elapsed = time.perf_counter() - t0
    tracker.end_all(grace_s=3.0)  # nothing should be left; never leave a rank behind
    return elapsed, int(code)


@dataclass(frozen=True)
class LaunchResult:
    """Full suite run vs bare launch, and each rank's peak RSS during the suites."""

    world_size: int
    backend: str
    bare_s: Summary
    suite_s: Summary
    ratio: Ratio
    suite_exit_codes: tuple[int, ...]
    rss_mb: Mapping[int, float]  # rank -> peak RSS over the suite runs, MB (1e6 bytes)

    @property
    def peak_rss_mb(self) -> float | None:
        return max(self.rss_mb.values()) if self.rss_mb else None

    def to_json(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            "bare_launch_s": self.bare_s.to_json(),
            "full_suite_s": self.suite_s.to_json(),
            "ratio": self.ratio.to_json(),
            "suite_exit_codes": list(self.suite_exit_codes),
            "peak_rss_mb_per_rank": {str(k): v for k, v in sorted(self.rss_mb.items())},
            "peak_rss_mb": self.peak_rss_mb,
        }


def read_rss(folder: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for path in sorted(folder.glob("rank-*.json")):
        record = json.loads(path.read_text())
        out[int(record["rank"])] = int(record["ru_maxrss_kib"]) * KIB / MB
    return out


def measure_launch(
    nproc: int,
    backend: str,
    work: Path,
    *,
    bare_repeats: int,
    suite_repeats: int,
    timeout_s: float,
    say: Any = print,
) -> LaunchResult:
    bare, suite, codes = [], [], []
    rss: dict[int, float] = {}
    for i in range(max(bare_repeats, suite_repeats)):
        if i < bare_repeats:
            logs = work / f"bare-{i}"
            argv = [
                *torchrun_command(nproc, backend, logs),
                "-m",
                "harness.bench.bare_rank",
                backend,
            ]
            seconds, code = run_timed(argv, child_env(), logs / "agent.log", timeout_s)
            if code != 0:
                raise QualificationError(
                    f"bare {nproc}-rank launch exited {code}; {rank_log_tail(logs)}"
                )
            bare.append(seconds)
            say(f"  bare launch {i + 1}/{bare_repeats}: {seconds:.1f}s")
        if i < suite_repeats:
            rss_dir = work / f"rss-{i}"
            addopts = " ".join(
                filter(None, (os.environ.get("PYTEST_ADDOPTS"), "-p harness.bench.rss_plugin"))
            )
            env = child_env({ENV_DIR: str(rss_dir), "PYTEST_ADDOPTS": addopts})
            argv = [
                sys.executable,
                "-m",
                "harness",
                "run",
                f"--nproc-per-node={nproc}",
                f"--backend={backend}",
                f"--out={work / f'suite-{i}'}",
                f"--timeout={timeout_s:g}",
            ]
            seconds, code = run_timed(argv, env, work / f"suite-{i}.log", timeout_s + 60)
            suite.append(seconds)
            codes.append(code)
            for rank, mb in read_rss(rss_dir).items():
                rss[rank] = max(mb, rss.get(rank, 0.0))
            say(f"  full suite run {i + 1}/{suite_repeats}: {seconds:.1f}s (exit {code})")
    bare_s, suite_s = summarize(bare), summarize(suite)
    return LaunchResult(
        world_size=nproc,
        backend=backend,
        bare_s=bare_s,
        suite_s=suite_s,
        ratio=ratio_of_medians(suite_s, bare_s),
        suite_exit_codes=tuple(codes),
        rss_mb=rss,
    )
