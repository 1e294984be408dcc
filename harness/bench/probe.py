"""A pytest plugin the bench adds to each rank of a measured `dcpqual run` (`PYTEST_ADDOPTS=-p
harness.bench.probe`): peak RSS and CPU time per rank, and with `DCPQUAL_BENCH_PROFILE=1` where
the rank's time went.

It writes `$DCPQUAL_BENCH_PROBE_DIR/rank-NN.json` at the end of pytest (before the rank plugin's
fast exit) and nothing else, so the measured run's evidence bundle is unchanged. Phases come
from pluggy's hook-call monitoring (wall seconds per hook, nested calls included) plus timers
on the rank plugin's agreement and record writes (main thread only); bench/README.md lists them.
Each suite phase is also given in CPU seconds of the main thread (`..._cpu_s`): with 16 ranks on
a few cores, a phase's wall seconds are mostly time spent waiting for a core or the disk, which
cutting that phase's own work does not give back.
"""

from __future__ import annotations

import functools
import importlib
import os
import resource
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

_T0 = time.time()
_had_torch = "torch" in sys.modules
import torch  # noqa: E402  (timed on purpose: this plugin loads before the rank plugin)

IMPORT_TORCH_S = 0.0 if _had_torch else time.time() - _T0
del torch

import pytest  # noqa: E402

from harness.atomic import atomic_write_text  # noqa: E402
from harness.schema.bench import ProbePhases, ProbeRecord  # noqa: E402

ENV_DIR = "DCPQUAL_BENCH_PROBE_DIR"
ENV_PROFILE = "DCPQUAL_BENCH_PROFILE"
# Functions of the rank plugin timed on the main thread, by phase.
TIMED: dict[str, tuple[str, ...]] = {
    "agreement_s": (
        "harness.rank.sidechannel:SideChannel.post_result",
        "harness.rank.sidechannel:SideChannel.gather_results",
    ),
    "records_s": ("harness.rank.rankfiles:RecordKeeper._write",),
}
BODY_HOOKS = ("pytest_runtest_setup", "pytest_runtest_call", "pytest_runtest_teardown")


def cpu_key(phase: str) -> str:
    """The CPU twin of a wall phase: "records_s" -> "records_cpu_s"."""
    return phase.removesuffix("_s") + "_cpu_s"


class Phases:
    """Wall seconds by phase on this rank, filled by the hook monitor and the timers."""

    def __init__(self) -> None:
        self.hooks: dict[str, float] = defaultdict(float)
        self.suites: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.timed: dict[str, float] = defaultdict(float)
        self.unprobed: list[str] = []
        self._stack: list[tuple[str, float, float]] = []  # hook, started (wall, CPU)
        self._suite: str | None = None
        self._body = 0.0
        self._body_cpu = 0.0
        self._timed_at_start: dict[str, float] = {}

    def before(self, hook: str, impls: Sequence[object], kwargs: Mapping[str, Any]) -> None:
        if hook == "pytest_runtest_protocol":
            parts = str(getattr(kwargs.get("item"), "nodeid", "")).split("/")
            self._suite = parts[1] if parts[0] == "suites" and len(parts) > 2 else parts[0]
            self._body, self._body_cpu, self._timed_at_start = 0.0, 0.0, dict(self.timed)
        self._stack.append((hook, time.perf_counter(), time.thread_time()))

    def after(
        self, outcome: object, hook: str, impls: Sequence[object], kw: Mapping[str, Any]
    ) -> None:
        if not self._stack:
            return
        name, started, started_cpu = self._stack.pop()
        seconds = time.perf_counter() - started
        cpu = time.thread_time() - started_cpu
        self.hooks[name] += seconds
        if name in BODY_HOOKS:
            self._body += seconds
            self._body_cpu += cpu
        elif name == "pytest_runtest_protocol" and self._suite is not None:
            suite = self.suites[self._suite]
            suite["tests"] += 1
            suite["tests_s"] += self._body
            suite["overhead_s"] += seconds - self._body
            suite["tests_cpu_s"] += self._body_cpu
            suite["overhead_cpu_s"] += cpu - self._body_cpu
            for key, total in self.timed.items():
                suite[key] += total - self._timed_at_start.get(key, 0.0)
            self._suite = None

    def wrap(self) -> None:
        """Time the rank plugin's agreement and record writes; name what no longer exists."""
        for phase, targets in TIMED.items():
            for target in targets:
                module_name, _, path = target.partition(":")
                owner_name, _, attr = path.rpartition(".")
                try:
                    owner = getattr(importlib.import_module(module_name), owner_name)
                    setattr(owner, attr, self._timer(phase, getattr(owner, attr)))
                except (ImportError, AttributeError):
                    self.unprobed.append(target)

    def _timer(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        main = threading.main_thread()

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not main:
                return fn(*args, **kwargs)
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.timed[phase] += time.perf_counter() - t0
                self.timed[cpu_key(phase)] += time.thread_time() - c0

        return timed

    def result(self) -> ProbePhases:
        h = self.hooks
        return ProbePhases(
            import_torch=IMPORT_TORCH_S,
            configure=h["pytest_configure"],
            collection=h["pytest_collection"],
            finish=h["pytest_sessionfinish"],
            suites={name: dict(values) for name, values in sorted(self.suites.items())},
            unprobed=tuple(self.unprobed),
        )


_PHASES: Phases | None = None


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Called when this plugin registers, before any other hook runs: start monitoring."""
    global _PHASES
    if os.environ.get(ENV_PROFILE) == "1" and _PHASES is None:
        _PHASES = Phases()
        _PHASES.wrap()
        pluginmanager.add_hookcall_monitoring(_PHASES.before, _PHASES.after)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    folder = os.environ.get(ENV_DIR)
    if not folder:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rank = int(os.environ.get("RANK", "0"))
    record = ProbeRecord(
        rank=rank,
        pid=os.getpid(),
        ru_maxrss_kib=int(usage.ru_maxrss),
        cpu_s=usage.ru_utime + usage.ru_stime,
        loaded_at=_T0,
        ended_at=time.time(),
        phases=None if _PHASES is None else _PHASES.result(),
    )
    atomic_write_text(Path(folder) / f"rank-{rank:02d}.json", record.model_dump_json())
