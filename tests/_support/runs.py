"""Helpers for tests that launch the real `dcpqual run` (in-process, through the CLI)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from _support import forked_cli
from harness.cli import main
from harness.schema.rank_record import RankRecord

REPO = Path(__file__).resolve().parents[2]
SUITES = REPO / "tests" / "rank_suites"


def run(out: Path, world: int, suite: str, *extra: str, nnodes: int = 1) -> tuple[int, float]:
    return run_together(out, world, (suite,), *extra, nnodes=nnodes)


def run_together(
    out: Path, world: int, suites: tuple[str, ...], *extra: str, nnodes: int = 1
) -> tuple[int, float]:
    """`dcpqual run` of several rank suites in one launch: (exit code, seconds)."""
    argv = ["run", "--nproc-per-node", str(world), "--tp", str(world * nnodes), "--out", str(out)]
    argv += [*extra, "--", *(str(SUITES / suite) for suite in suites)]
    started = time.monotonic()
    code = main(argv)
    return code, time.monotonic() - started


def run_with_folder(
    base: Path, variable: str, suites: tuple[str, ...], *extra: str
) -> tuple[int, float, Path, Path]:
    """A 2-rank `dcpqual run` of `suites` into `base/bundle`, with `$variable` naming a fresh
    folder beside it for the suites' tests: (exit code, seconds, out folder, that folder)."""
    folder = base / variable.lower()
    folder.mkdir()
    out = base / "bundle"
    with pytest.MonkeyPatch.context() as env:
        env.setenv(variable, str(folder))
        code, elapsed = run_together(out, 2, suites, *extra)
    return code, elapsed, out, folder


@dataclass(frozen=True)
class Launched:
    """A real `dcpqual run` that several tests read, launched once: its exit code (or codes,
    one per agent), its out folder, and what it printed on stdout."""

    codes: tuple[int, ...]
    out: Path
    printed: str = ""


THREADED_PRELOAD = Path(__file__).parent / "threaded_preload"


def preload_left_a_thread(env: Any, where: str = "agent,forkserver") -> None:
    """`env` (a MonkeyPatch) puts a `sitecustomize` on PYTHONPATH that leaves a thread running
    where the ranks' preload is done, as a preload that starts a thread pool would: in the
    agent (which then starts a fresh forkserver instead of forking itself) and, unless `where`
    is "agent", in that fresh forkserver (which may then fork no rank: the ranks start cold)."""
    path = os.pathsep.join(p for p in (str(THREADED_PRELOAD), os.environ.get("PYTHONPATH")) if p)
    env.setenv("PYTHONPATH", path)
    env.setenv("DCPQUAL_TEST_THREAD_IN", where)


def launch_printing(out: Path, argv: list[str]) -> Launched:
    """`dcpqual run` in-process, as `main(argv)`, keeping what it prints on stdout (where a
    test's own `capsys` cannot reach: a fixture that outlives the test)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(argv)
    return Launched((code,), out, printed.getvalue())


def launched_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, launch: Callable[[Path], Launched]
) -> Launched:
    """`launch(folder)` once for the whole pytest session, not once per xdist worker whose
    tests read it: the first worker to ask launches, under a lock beside the workers' temporary
    folders, and writes what it launched; the others wait for that and read it (the recipe of
    pytest-xdist's documentation, keyed by the session's run id: a --basetemp folder outlives
    its session). The readers must not change the run's files."""
    session = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if session is None:  # one process: its own folder
        return launch(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent / f"{name}-{session}"  # all workers'
    answer = shared / "launched.json"
    with FileLock(f"{shared}.lock"):
        if answer.is_file():
            data = json.loads(answer.read_text())
            return Launched(tuple(data["codes"]), Path(data["out"]), data["printed"])
        shutil.rmtree(shared, ignore_errors=True)  # what a launch that raised left
        shared.mkdir()
        launched = launch(shared)
        data = {"codes": launched.codes, "out": str(launched.out), "printed": launched.printed}
        answer.write_text(json.dumps(data))
        return launched


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# How long a two-agent job may take before both agents are stopped (SIGTERM: each still
# finishes its bundle), far below torchrun's own rendezvous timeout.
TWO_NODES_S = 420.0
# How long a stopped agent has to finish its bundle before it is SIGKILLed.
STOP_GRACE_S = 120.0


def two_nodes(out: Path, nproc: int, *suites: str, uncaptured: bool = False) -> tuple[int, int]:
    """Two `dcpqual run` agents of `nproc` ranks each, as on two hosts: two processes sharing
    one rendezvous and one `--out`, running `suites` (with pytest's `-s` where `uncaptured`).
    One that ends non-zero while the other still waits for it stops the other (SIGTERM), so a
    dead agent fails the test in seconds, not at the rendezvous timeout. Returns both exit
    codes; their consoles go to `out.parent`."""
    endpoint = f"127.0.0.1:{free_port()}"
    pytest_args = ["-s"] if uncaptured else []
    pytest_args += [str(SUITES / suite) for suite in suites]
    agents: dict[int, subprocess.Popen[bytes]] = {}
    for k in (0, 1):
        argv = ["run", "--nproc-per-node", str(nproc), "--nnodes", "2", "--node-rank", str(k)]
        argv += ["--rdzv-endpoint", endpoint, "--tp", str(2 * nproc), "--out", str(out)]
        console = (out.parent / f"{out.name}-node-{k}.console").open("wb")
        with console:
            agents[k] = subprocess.Popen(
                [sys.executable, "-m", "harness", *argv, "--", *pytest_args],
                stdout=console,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
    deadline = time.monotonic() + TWO_NODES_S
    stopped_at: float | None = None
    while any(a.poll() is None for a in agents.values()):
        failed = any(a.returncode not in (None, 0) for a in agents.values())
        if stopped_at is None and (failed or time.monotonic() > deadline):
            for agent in agents.values():
                if agent.poll() is None:
                    agent.send_signal(signal.SIGTERM)
            stopped_at = time.monotonic()
        elif stopped_at is not None and time.monotonic() - stopped_at > STOP_GRACE_S:
            for agent in agents.values():
                if agent.poll() is None:
                    agent.kill()  # an agent that ignores SIGTERM must not hang the test
        time.sleep(0.2)
    return agents[0].returncode, agents[1].returncode


def wait_until(check: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `check` until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def ranks_inside(out: Path, nranks: int, test: str) -> bool:
    """Every one of `nranks` ranks' records says it is running `test` now (a name, matched as
    `::test`); False while a record is missing or half written."""
    try:
        recs = records(out)
    except (OSError, ValueError):
        return False
    running = [r.current_test or "" for r in recs.values()]
    return len(running) == nranks and all(f"::{test}" in t for t in running)


def receipt(out: Path) -> dict[str, Any]:
    return json.loads((out / "receipt.json").read_text())


def records(out: Path) -> dict[int, RankRecord]:
    return {
        rec.rank: rec
        for rec in (RankRecord.read(p) for p in sorted((out / "records").glob("rank-*.json")))
    }


def processes_of_run(out: Path) -> list[str]:
    """Live processes whose command line or environment names the run's out folder.

    Ranks and torchrun name it on their command line; anything they start inherits
    DCPQUAL_PLAN (which names <out>) in its environment.
    """
    needle = str(out).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if state not in ("Z", "X") and (needle in cmdline or needle in environ):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {command}")
    return found


FAST_S = 90.0  # an injected fault must end the run well inside this


def assert_fault(out: Path, code: int, elapsed: float, rank: int, test: str) -> dict[str, Any]:
    assert code == 1
    assert elapsed < FAST_S, f"fault took {elapsed:.0f}s to end the run"
    assert processes_of_run(out) == []
    data = receipt(out)
    assert data["verdict"] == "fail"
    assert data["run"]["exit_code"] != 0  # ranks exit non-zero, fast exit included
    cause = data["root_cause"]
    assert cause["rank"] == rank, cause
    assert cause["test"].endswith(f"::{test}"), cause
    return data


# The capture check of the Kimi-K3 stand-in only, at 2 ranks (tp = dcp = 2, where Kimi still
# has 96 heads): the seed change's before and after differ in nothing else.
KIMI_CAPTURE = ("suites/capture/test_capture.py", "-k", "kimi")
KIMI_WORLD = 2


def kimi_capture_run(
    out: Path, warm_impl: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`dcpqual run --warm-impl WARM_IMPL` of the Kimi-K3 capture check, as a user types it."""
    argv = ["run", "--nproc-per-node", str(KIMI_WORLD), "--tp", str(KIMI_WORLD)]
    argv += ["--dcp", str(KIMI_WORLD), "--warm-impl", warm_impl]
    argv += ["--out", str(out), "--timeout", "300", "--", *KIMI_CAPTURE]
    return forked_cli.run(argv, cwd=REPO, env={**os.environ, **(env or {})}, timeout=420)
