"""`dcpqual run` as a pipeline of small steps (nox's habit):

    prepare the out folder -> plan the torchrun command -> launch it once -> collect what only
    the launcher knows -> finalize the evidence bundle -> verify it -> exit 0 only on a pass.

`launch` owns the process tree: torchrun runs in its own session, the launcher remembers every
process below it, enforces the overall `--timeout` by ending the whole tree, and after torchrun
exits ends anything still alive, so no rank outlives a run. The evidence functions are reached
through `Evidence`, imported lazily, so tests can swap them for fakes.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TextIO

from harness.evidence.run_context import RunContext
from harness.launch import nodes
from harness.launch.collect import LaunchResult, run_context
from harness.launch.plan import SHUTDOWN_TIMEOUT_S, RunOptions, RunPlan, build_plan
from harness.launch.proctree import Tracker
from harness.launch.progress import Progress, make_progress, poller, snapshot
from harness.launch.ranklogs import collect_rank_logs

# How long node 0 waits for the other nodes' "finished" markers after its own torchrun exits,
# and how long they wait for its receipt. Their torchruns end within seconds of each other.
NODE_WAIT_S = 120.0
# How long node K waits for node 0 to create the shared out folder.
JOIN_WAIT_S = 120.0


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Evidence:
    """The evidence writer's entry points, as the launcher uses them."""

    prepare_out_dir: Callable[[Path], Path]
    default_out_dir: Callable[[], Path]
    finalize_bundle: Callable[[Path, RunContext], Any]
    verify_bundle: Callable[[Path], list[str]]

    @classmethod
    def load(cls) -> Evidence:
        from harness.evidence.verify import verify_bundle
        from harness.evidence.writer import default_out_dir, finalize_bundle, prepare_out_dir

        def problems(path: Path) -> list[str]:
            result = verify_bundle(path)
            return list(getattr(result, "problems", result))

        return cls(prepare_out_dir, default_out_dir, finalize_bundle, problems)


class Terminated(KeyboardInterrupt):
    """The launcher itself got SIGTERM (a cancelled CI job): end the tree like on ^C."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """In torchrun's process: get SIGTERM if the launcher dies, even by SIGKILL (Linux prctl).

    torchrun forwards SIGTERM to its ranks and exits, so a killed launcher leaves no job behind.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def launch(
    plan: RunPlan,
    *,
    tick: Callable[[float], None] | None = None,
    tick_s: float = 0.5,
    console: TextIO | None = None,
) -> LaunchResult:
    """Run the planned torchrun once; end its whole tree at the overall timeout or on ^C.

    With `--tee`, torchrun's console (its agent log plus the tee'd ranks' lines) is read through
    a pipe: all of it still goes to agent.log, and the ranks' lines also to `console`."""
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    timeout_s = plan.options.timeout_s
    started_at, t0 = _now(), time.monotonic()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) or signal.SIG_DFL
    if in_main:
        signal.signal(signal.SIGTERM, _on_sigterm)
    tee = plan.options.tee and console is not None
    with plan.agent_log.open("wb") as log:
        proc = subprocess.Popen(
            plan.argv,
            env=plan.child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if tee else log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # ^C at the terminal reaches the launcher, not the ranks
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    relay = None
    if tee:
        assert proc.stdout is not None and console is not None
        relay = threading.Thread(
            target=_relay,
            args=(proc.stdout, plan.agent_log, console, plan.options.tee),
            daemon=True,
        )
        relay.start()
    tracker = Tracker(proc.pid)
    timed_out = False
    try:
        while True:
            try:
                proc.wait(timeout=tick_s)
                break
            except subprocess.TimeoutExpired:
                pass
            tracker.scan()
            elapsed = time.monotonic() - t0
            if tick is not None:
                tick(elapsed)
            if elapsed > timeout_s:
                timed_out = True
                tracker.end_all(grace_s=SHUTDOWN_TIMEOUT_S + 5)
                proc.wait()
                break
    except BaseException:
        tracker.end_all(grace_s=5.0)
        proc.wait()
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    if relay is not None:
        relay.join(timeout=5.0)
    leftovers = tracker.survivors()
    if leftovers:
        tracker.end_all(grace_s=3.0)
    return LaunchResult(
        exit_code=int(proc.returncode),
        timed_out=timed_out,
        started_at=started_at,
        finished_at=_now(),
        elapsed_s=time.monotonic() - t0,
        leftovers=tuple(p.pid for p in leftovers),
    )


# torchrun's prefix on a tee'd rank line: "[default0]:..." (role name + local rank).
_RANK_LINE = re.compile(rb"^\[[A-Za-z_]*(\d+)\]:")


def _relay(pipe: IO[bytes], agent_log: Path, console: TextIO, ranks: tuple[int, ...]) -> None:
    """Copy torchrun's console to agent.log; pass the tee'd ranks' lines to the terminal."""
    with agent_log.open("ab") as log:
        for line in pipe:
            log.write(line)
            log.flush()
            match = _RANK_LINE.match(line)
            if match is not None and int(match[1]) in ranks:
                console.write(line.decode("utf-8", errors="replace"))
                console.flush()


def prepare(options: RunOptions, evidence: Evidence) -> Path:
    """The out folder: node 0 creates it (refusing a non-empty one), others join node 0's."""
    if options.node_rank == 0:
        out = options.out_dir if options.out_dir is not None else evidence.default_out_dir()
        return Path(evidence.prepare_out_dir(Path(out))).absolute()
    assert options.out_dir is not None and options.rdzv_endpoint is not None
    return nodes.join_out_dir(
        options.out_dir,
        nnodes=options.nnodes,
        endpoint=options.rdzv_endpoint,
        wait_s=JOIN_WAIT_S,
    )


def _say(stream: TextIO, text: str) -> None:
    stream.write(text + "\n")
    stream.flush()


def report(stream: TextIO, out_dir: Path, receipt: Any, problems: list[str]) -> None:
    """A few lines for the person at the terminal, ending as pytest does; the bundle has the
    rest."""
    verdict = str(getattr(receipt, "verdict", "fail")).upper()
    _say(stream, f"dcpqual run: verdict {verdict} (status {getattr(receipt, 'status', '?')})")
    cause = getattr(receipt, "root_cause", None)
    if cause is not None:
        where = f" in {cause.test}" if getattr(cause, "test", None) else ""
        who = "?" if cause.rank is None else cause.rank
        _say(stream, f"  root cause: rank {who}{where}: {cause.message}")
    for problem in problems:
        _say(stream, f"  bundle problem: {problem}")
    _say(stream, f"  evidence: {out_dir}  (summary.md, receipt.json, logs/)")
    if hasattr(receipt, "failed_tests"):
        from harness.evidence.ending import ending_lines

        for line in ending_lines(receipt, out_dir):
            _say(stream, line)


def run(
    options: RunOptions,
    *,
    evidence: Evidence | None = None,
    stream: TextIO | None = None,
    progress: Progress | None = None,
) -> int:
    """The whole `dcpqual run`; returns the process exit code (0 only on a verified pass)."""
    stream = sys.stdout if stream is None else stream
    evidence = Evidence.load() if evidence is None else evidence
    out_dir = prepare(options, evidence)
    plan = build_plan(options, out_dir)
    endpoint = options.rdzv_endpoint or ""
    marker = nodes.NodeMarker.here(options.node_rank, options.nnodes, endpoint, _now())
    if options.multi_node:
        nodes.write_marker(out_dir, marker)
    _say(
        stream,
        f"dcpqual run: {options.world_size} ranks ({options.nnodes} node(s) x "
        f"{options.nproc_per_node}), backend {options.backend}, evidence -> {out_dir}",
    )
    progress = make_progress(stream, plain=bool(options.tee)) if progress is None else progress
    records = out_dir / "records"
    try:
        result = launch(
            plan,
            tick=poller(records, options.world_size, progress),
            console=stream if options.tee else None,
        )
    except BaseException:
        progress.close()
        raise
    progress.close(snapshot(records, options.world_size, result.elapsed_s))
    if options.multi_node:
        finished = nodes.NodeMarker(
            **{
                **marker.to_json(),
                "state": "finished",
                "exit_code": result.exit_code,
                "timed_out": result.timed_out,
                "finished_at": result.finished_at,
            }
        )
        nodes.write_marker(out_dir, finished)
    _say(
        stream,
        f"dcpqual run: torchrun exited {result.exit_code} after {result.elapsed_s:.1f}s"
        + (" (timed out: whole tree ended)" if result.timed_out else ""),
    )
    if options.node_rank != 0:
        return _follow_node0(stream, out_dir, result)
    markers = (
        nodes.wait_for_nodes(out_dir, options.nnodes, NODE_WAIT_S) if options.multi_node else None
    )
    collect_rank_logs(out_dir, options.world_size, options.nproc_per_node)
    ctx = run_context(plan, result, nodes=markers)
    receipt = evidence.finalize_bundle(out_dir, ctx)
    problems = evidence.verify_bundle(out_dir)
    report(stream, out_dir, receipt, problems)
    passed = getattr(receipt, "verdict", None) == "pass"
    return 0 if passed and not problems and ctx.exit_code == 0 and not ctx.timed_out else 1


def _say_ending(stream: TextIO, data: dict[str, Any], out_dir: Path) -> None:
    """Node 0's ending on this node too, when its receipt reads as one."""
    from pydantic import ValidationError

    from harness.evidence.ending import ending_lines
    from harness.evidence.schema import Receipt

    try:
        receipt = Receipt.model_validate(data)
    except ValidationError:
        return
    for line in ending_lines(receipt, out_dir):
        _say(stream, line)


def _follow_node0(stream: TextIO, out_dir: Path, result: LaunchResult) -> int:
    receipt = nodes.wait_for_receipt(out_dir, NODE_WAIT_S)
    if receipt is None:
        _say(stream, f"dcpqual run: node 0 wrote no bundle in {out_dir} within {NODE_WAIT_S:g}s")
        return 1
    verdict = receipt.get("verdict")
    _say(stream, f"dcpqual run: node 0's bundle says {str(verdict).upper()}: {out_dir}")
    _say_ending(stream, receipt, out_dir)
    return 0 if verdict == "pass" and result.exit_code == 0 else 1
