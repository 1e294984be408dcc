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
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, TextIO

from harness.core.secrets import environment_scrubber, typed_secrets
from harness.errors import DcpqualError, UsageError
from harness.evidence import rules
from harness.evidence.redact import ScrubFailed
from harness.evidence.run_context import RunContext
from harness.launch import ending, nodes
from harness.launch.agent import cold_reason
from harness.launch.context import run_context
from harness.launch.ending import Terminated
from harness.launch.guardian import Guardian
from harness.launch.plan import SHUTDOWN_TIMEOUT_S, RunOptions, RunPlan, build_plan
from harness.launch.proctree import ExitWait, Tracker, end_launch_root, identify, start_launch_root
from harness.launch.progress import Progress, Snapshot, make_progress, poller, snapshot
from harness.launch.ranklogs import collect_rank_logs
from harness.launch.rankview import RecordReader
from harness.rank.outrelay import OUTPUT_SECRETS_ENV
from harness.schema.launch import Interruption, Launch, NodeState
from harness.schema.layout import MERGED_JUNIT, RECEIPT_NAME, RECORDS_DIR, SUMMARY_NAME
from harness.schema.plan import PLAN_ENV
from harness.schema.receipt import NodeZeroGone, Receipt, Scrub, Stray
from harness.terminal import printable

if TYPE_CHECKING:
    from harness.evidence.redact import ScrubReport

# How long node 0 waits for the other nodes' "finished" markers after its own torchrun exits,
# and how long they wait for its receipt (node 1, after that, to take over node 0's claim on the
# folder when node 0 is gone). Their torchruns end within seconds of each other. NODE_WAIT_ENV
# sets it (seconds > 0), as DCPQUAL_RUN_TIMEOUT sets --timeout.
NODE_WAIT_S = 120.0
NODE_WAIT_ENV = "DCPQUAL_RUN_NODE_WAIT"
# How long node K waits for node 0 to create the shared out folder.
JOIN_WAIT_S = 120.0
# How often the launcher looks at the run while torchrun runs: the progress line, the overall
# timeout, ranks gone mid-suite (their grace is DEAD_RANK_GRACE_S). At 16 ranks nearly every
# record changes between two looks, and each is parsed again then.
TICK_S = 1.0
# How often the process tree is walked while torchrun runs (each walk reads every process's
# /proc entry). Endings walk it again before they act, the subreaper and the cgroup catch what
# re-parents or hides between walks, and the dead-rank watch walks it for a rank it has not
# seen yet.
SCAN_S = 2.0


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _nothing_scrubbed(out_dir: Path) -> ScrubReport:
    from harness.evidence.redact import ScrubReport

    return ScrubReport(changed=(), renamed=())


@dataclass(frozen=True)
class Evidence:
    """The evidence writer's entry points, as the launcher uses them."""

    prepare_out_dir: Callable[[Path], Path]
    default_out_dir: Callable[[], Path]
    finalize_bundle: Callable[[Path, RunContext], Receipt]
    verify_bundle: Callable[[Path], list[str]]
    scrub_out_dir: Callable[[Path], ScrubReport] = _nothing_scrubbed
    set_aside: Callable[[Path], list[Stray]] = lambda out_dir: []
    take_out_dir: Callable[[Path], bool] = lambda out_dir: False

    @classmethod
    def load(cls) -> Evidence:
        from harness.evidence.strays import set_aside
        from harness.evidence.verify import verify_bundle
        from harness.evidence.writer import (
            default_out_dir,
            finalize_bundle,
            prepare_out_dir,
            scrub_out_dir,
            take_out_dir,
        )

        def problems(path: Path) -> list[str]:
            return list(verify_bundle(path).problems)

        return cls(
            prepare_out_dir,
            default_out_dir,
            finalize_bundle,
            problems,
            scrub_out_dir,
            set_aside,
            take_out_dir,
        )


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """In torchrun's process: get SIGTERM if the launcher dies, even by SIGKILL (Linux prctl).

    torchrun forwards SIGTERM to its ranks and exits, so a killed launcher leaves no job behind.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def launch(
    plan: RunPlan,
    *,
    tick: Callable[[float], None] | None = None,
    tick_s: float = TICK_S,
    console: TextIO | None = None,
    reader: RecordReader | None = None,
    hold: ending.Hold | None = None,
) -> Launch:
    """Run the planned torchrun once and end its whole tree: at the overall timeout, when a rank
    left mid-suite, on ^C or SIGTERM (returned as `interrupted`, not raised), and after torchrun
    exits, when every process the run left behind (orphans adopted as subreaper) is ended.

    With `--tee`, torchrun's console (its agent log plus the tee'd ranks' lines) is read through
    a pipe: all of it still goes to agent.log, and the ranks' lines also to `console`.
    `reader`: the records as the `tick` reads them, shared with the dead-rank watch.
    `hold`: the run's signal hold (entered by the caller); it raises on ^C and SIGTERM as this
    launch's own handler would, and the launch starts it holding once torchrun has exited."""
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    if reader is None:
        reader = RecordReader(plan.out_dir / RECORDS_DIR, plan.options.world_size)
    timeout_s = plan.options.timeout_s
    started_at, t0 = _now(), time.monotonic()
    # Without the run's hold (the bench's launches), a hold of its own that never starts
    # holding: ^C and SIGTERM raise as they would, and one Python dropped is raised again.
    own = None
    if hold is None and threading.current_thread() is threading.main_thread():
        own = ending.Hold()
        own.__enter__()
    raising = hold if hold is not None else own
    tee = plan.options.tee and console is not None
    linux = sys.platform == "linux"
    adopting = linux and ending.set_subreaper(True)
    cgroup = ending.Cgroup.create() if linux else None

    def in_child() -> None:  # pragma: no cover - runs in the forked child
        _die_with_parent()
        if cgroup is not None:
            cgroup.join()

    proc: subprocess.Popen[bytes] | None = None
    try:
        env = {**plan.child_env(), OUTPUT_SECRETS_ENV: json.dumps(typed_secrets())}
        with plan.agent_log.open("wb") as log:
            proc = start_launch_root(
                lambda: subprocess.Popen(
                    plan.argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE if tee else log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # ^C at the terminal reaches the launcher only
                    preexec_fn=in_child if linux else None,
                )
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
        tracker = Tracker(proc.pid, adopter=os.getpid() if adopting else None)
        exited = None if hold is None else hold.start
        hurry = None if raising is None else raising.hurry
        lost = None if raising is None else raising.lost
        outcome = _supervise(
            proc,
            tracker,
            reader,
            t0,
            timeout_s,
            tick,
            tick_s,
            exited,
            hurry,
            lost,
            plan.options.node_rank,
        )
        if relay is not None:
            relay.join(timeout=5.0)
            if not relay.is_alive() and proc.stdout is not None:
                proc.stdout.close()  # the relay read torchrun's output to its end
        tracker.scan()  # orphans that re-parented to us after the last tick
        if cgroup is not None:  # and whatever is still in the run's cgroup, wherever it went
            tracker.seen |= {p for pid in cgroup.pids() if (p := identify(pid)) is not None}
        marked = _plan_entry(plan)
        witness = None if marked is None else ending.EnvironmentWitness(marked)
        if witness is not None:
            tracker.seen |= witness.find()
        survivors = tracker.survivors()
        relays = ending.output_relays(survivors, _relay_pids(reader))
        # What outlived torchrun is a leftover whether or not it ends while relays finish.
        leftovers = [p for p in survivors if p.pid != proc.pid and p not in relays]
        if not leftovers:  # else they may hold the relays open: ending them ends the relays
            ending.let_relays_finish(relays)
        later = [p for p in tracker.survivors() if p.pid != proc.pid and p not in relays]
        leftovers = sorted({*leftovers, *later}, key=lambda p: p.pid)
        if leftovers:
            tracker.end_all(grace_s=3.0)
        # Until the tree is empty: a helper that re-forks outruns any single scan and kill.
        swept = ending.sweep(tracker, cgroup, witness, keep={proc.pid})
        leftovers = sorted({*leftovers, *swept}, key=lambda p: p.pid)
        ending.reap(p for p in tracker.seen if p.pid != proc.pid)
    finally:
        if proc is not None:
            end_launch_root(proc.pid)
        if cgroup is not None:
            cgroup.remove()
        if adopting:
            ending.set_subreaper(False)
        if own is not None:
            own.__exit__(None, None, None)
    return Launch(
        exit_code=int(proc.returncode),
        timed_out=outcome.timed_out,
        started_at=started_at,
        finished_at=_now(),
        elapsed_s=round(time.monotonic() - t0, 3),
        leftovers=[p.pid for p in leftovers],
        interrupted=outcome.interrupted,
        ended_for_ranks_gone_mid_suite=list(outcome.dead_ranks),
    )


@dataclass(frozen=True)
class _Outcome:
    timed_out: bool = False
    interrupted: Interruption | None = None
    dead_ranks: tuple[int, ...] = ()


def _supervise(
    proc: subprocess.Popen[bytes],
    tracker: Tracker,
    reader: RecordReader,
    t0: float,
    timeout_s: float,
    tick: Callable[[float], None] | None,
    tick_s: float,
    exited: Callable[[], None] | None = None,
    hurry: threading.Event | None = None,
    lost: Callable[[], KeyboardInterrupt | None] | None = None,
    node: int | None = None,
) -> _Outcome:
    """Wait for torchrun; end the tree on a timeout, a rank gone mid-suite, ^C or SIGTERM.
    `exited` is called as soon as torchrun is known to have exited, on every path: a signal
    before it is this launch's interruption, one after it is the caller's to hold. `hurry`:
    set by a signal the hold took after the one it raised (the ending then ends the tree at
    once).
    `lost`: a signal's exception that its handler raised where Python drops it (a gc callback,
    a `__del__`): raised again here, so the signal still ends the run."""
    exited = (lambda: None) if exited is None else exited
    lost = (lambda: None) if lost is None else lost
    watch = ending.DeadRankWatch(reader, tracker, node)
    exit_wait = ExitWait(proc)
    next_scan = 0.0
    try:
        while True:
            if (dropped := lost()) is not None:
                raise dropped
            if exit_wait.wait(tick_s):
                exited()
                return _Outcome()
            if time.monotonic() >= next_scan:
                tracker.scan()
                next_scan = time.monotonic() + SCAN_S
            elapsed = time.monotonic() - t0
            if tick is not None:
                tick(elapsed)
            if elapsed > timeout_s:
                tracker.end_all(grace_s=SHUTDOWN_TIMEOUT_S + 5)
                proc.wait()
                exited()
                return _Outcome(timed_out=True)
            dead = watch.overdue()
            if dead:
                tracker.end_all(grace_s=SHUTDOWN_TIMEOUT_S + 5)
                proc.wait()
                exited()
                return _Outcome(dead_ranks=tuple(dead))
    except KeyboardInterrupt as exc:
        sig = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
        # What had run when the signal came, before ending the tree marks the rest stopped.
        seen = snapshot(reader, 0.0, fresh=True)
        interrupted = ending.interruption(sig, time.monotonic() - t0, seen)
        # The hold takes a second ^C meanwhile: it hurries this ending, never aborts it.
        tracker.end_all(grace_s=5.0, hurry=hurry)
        proc.wait()
        exited()
        return _Outcome(interrupted=interrupted)
    except BaseException:
        tracker.end_all(grace_s=5.0)
        proc.wait()
        raise
    finally:
        exit_wait.close()


# torchrun's prefix on a tee'd rank line: "[default0]:..." (role name + local rank).
_RANK_LINE = re.compile(rb"^\[[A-Za-z_]*(\d+)\]:")


def _relay(pipe: IO[bytes], agent_log: Path, console: TextIO, ranks: tuple[int, ...]) -> None:
    """Copy torchrun's console to agent.log; pass the tee'd ranks' lines to the terminal."""
    scrub = environment_scrubber()
    with agent_log.open("ab") as log:
        for line in pipe:
            log.write(line)
            log.flush()
            match = _RANK_LINE.match(line)
            if match is not None and int(match[1]) in ranks:
                console.write(scrub.text(line.decode("utf-8", errors="replace"))[0])
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


@dataclass(frozen=True)
class ScrubbedProgress:
    """The progress display with the test's id (its only free text) scrubbed before it is
    drawn: scrubbing the drawn line would miss a secret that a terminal's wrap split."""

    shown: Progress

    def update(self, snap: Snapshot) -> None:
        self.shown.update(self._clean(snap))

    def close(self, snap: Snapshot | None = None) -> None:
        self.shown.close(None if snap is None else self._clean(snap))

    @staticmethod
    def _clean(snap: Snapshot) -> Snapshot:
        if snap.current is None:
            return snap
        return replace(snap, current=environment_scrubber().text(snap.current)[0])


def _say(stream: TextIO, text: str) -> None:
    """One line to the console, scrubbed of secrets (paths, messages and commands may hold one)."""
    stream.write(printable(environment_scrubber().text(text)[0]) + "\n")
    stream.flush()


def report(stream: TextIO, out_dir: Path, receipt: Receipt, problems: list[str]) -> None:
    """A few lines for the person at the terminal, ending as pytest does; the bundle has the
    rest."""
    from harness.evidence.short_summary import ending_lines, first_line

    _say(stream, f"dcpqual run: verdict {receipt.verdict.upper()} (status {receipt.status})")
    cause = receipt.root_cause
    first = receipt.failed_tests[0].nodeid if receipt.failed_tests else None
    if cause is not None and (cause.test is None or cause.test != first):
        # A test's failure is the first FAILED line of the ending; anything else is said here,
        # in one line (summary.md has the whole message).
        where = f" in {cause.test}" if cause.test else ""
        who = "?" if cause.rank is None else cause.rank
        _say(stream, f"  root cause: rank {who}{where}: {first_line(cause.message)}")
    for problem in problems:
        _say(stream, f"  bundle problem: {problem}")
    _say(stream, f"  evidence: {out_dir}  (summary.md, receipt.json, logs/)")
    for line in ending_lines(receipt, out_dir):
        _say(stream, line)
    if problems:  # the ending says the receipt's verdict: it is not the run's last word
        _say(stream, unverified_line(receipt, problems))


def unverified_line(receipt: Receipt, problems: Sequence[str]) -> str:
    """The last line of a run whose bundle does not verify: its receipt's verdict stands for
    nothing, whatever the ending above it says."""
    return (
        f"dcpqual run: INVALID: the bundle does not verify ({len(problems)} problem(s), the "
        f"first: {problems[0]}), so its verdict {receipt.verdict.upper()} stands for nothing"
    )


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
    if options.multi_node:
        node_wait_s()  # a bad setting is one line before anything is touched
    out_dir = prepare(options, evidence)
    try:
        return _run(options, evidence, stream, progress, out_dir)
    finally:
        from harness.evidence.writer import release_out_dir

        release_out_dir(out_dir)  # the run is over: the folder holds its bundle (or what ran)


def _run(
    options: RunOptions,
    evidence: Evidence,
    stream: TextIO,
    progress: Progress | None,
    out_dir: Path,
) -> int:
    plan = build_plan(options, out_dir)
    # Whatever kills this process from here on (SIGKILL, the OOM killer), the out folder is
    # scrubbed: by the guardian, unless this launcher says its own ending is done.
    guardian = Guardian.start(out_dir, _plan_entry(plan), typed_secrets())
    try:
        code = _launch_and_end(options, evidence, stream, progress, out_dir, plan)
    except BaseException:
        guardian.abandon()
        raise
    guardian.done()
    return code


def _relay_pids(reader: RecordReader) -> set[int]:
    """The output relays the ranks' records name."""
    return {
        status.start.output_relay
        for status in reader.statuses().values()
        if status.start is not None and status.start.output_relay is not None
    }


def _plan_entry(plan: RunPlan) -> str | None:
    marked = plan.env.get(PLAN_ENV)
    return None if marked is None else f"{PLAN_ENV}={marked}"


def _launch_and_end(
    options: RunOptions,
    evidence: Evidence,
    stream: TextIO,
    progress: Progress | None,
    out_dir: Path,
    plan: RunPlan,
) -> int:
    endpoint = options.rdzv_endpoint or ""
    marker = nodes.started_marker(options.node_rank, options.nnodes, endpoint, _now())
    if options.multi_node:
        nodes.write_marker(out_dir, marker)
    _say(
        stream,
        f"dcpqual run: {options.world_size} ranks ({options.nnodes} node(s) x "
        f"{options.nproc_per_node}), backend {options.backend}, evidence -> {out_dir}",
    )
    progress = make_progress(stream, plain=bool(options.tee)) if progress is None else progress
    progress = ScrubbedProgress(progress)
    reader = RecordReader(out_dir / RECORDS_DIR, options.world_size)
    # Every ending, from torchrun's exit on: the bundle is finished even if ^C or SIGTERM comes
    # meanwhile, and such a signal is still the run's interruption.
    with ending.Hold() as held:
        try:
            result = launch(
                plan,
                tick=poller(reader, progress),
                console=stream if options.tee else None,
                reader=reader,
                hold=held,
            )
        except BaseException:
            progress.close()
            raise
        held.start()  # the launch started it as torchrun exited; this is the latest moment
        seen = snapshot(reader, result.elapsed_s, fresh=True)
        progress.close(seen)
        code = _finish(options, evidence, stream, plan, marker, result, seen, held)
    return _held_exit(stream, held, result, code)


def _held_exit(stream: TextIO, held: ending.Hold, result: Launch, code: int) -> int:
    """The exit code once the bundle is done: a signal held too late to be named in the
    receipt still makes the run exit as an interrupted run does, and says so."""
    late = held.interruption()
    if result.interrupted is not None or late is None or held.named:
        return code
    _say(
        stream,
        f"dcpqual run: interrupted by {late.signal} after the verdict was decided (too late "
        f"for the receipt to name it); exiting {late.exit_code}",
    )
    return late.exit_code


def _finish(
    options: RunOptions,
    evidence: Evidence,
    stream: TextIO,
    plan: RunPlan,
    marker: NodeState,
    result: Launch,
    seen: Snapshot,
    held: ending.Hold,
) -> int:
    """Scrub first, then name the interruption, set strays aside (before anything is written
    into a folder the ranks could have made a link), write and verify the bundle."""
    out_dir = plan.out_dir
    try:
        scrubbed = evidence.scrub_out_dir(out_dir)
    except ScrubFailed as exc:
        _say(sys.stderr, _secrets_left(out_dir, exc))
        return 1
    except Exception as exc:  # out of memory, a bug: what it did not reach may hold a secret
        _say(sys.stderr, _scrub_stopped(out_dir, exc))
        return 1
    if result.interrupted is not None:
        _say(
            stream,
            f"dcpqual run: interrupted by {result.interrupted.signal} after "
            f"{result.elapsed_s:.1f}s; whole tree ended, writing the bundle of what ran",
        )
    if options.multi_node:
        try:
            nodes.write_marker(out_dir, nodes.finished_marker(marker, result))
        except OSError as exc:
            _say(
                sys.stderr,
                f"dcpqual run: error: could not write node {options.node_rank}'s finished "
                f"marker in {out_dir}: {_why(exc)}",
            )
            return 1
    _say(
        stream,
        f"dcpqual run: torchrun exited {result.exit_code} after {result.elapsed_s:.1f}s"
        + (" (timed out: whole tree ended)" if result.timed_out else "")
        + (
            f" (rank(s) {', '.join(map(str, result.ended_for_ranks_gone_mid_suite))} left "
            "mid-suite: whole tree ended)"
            if result.ended_for_ranks_gone_mid_suite
            else ""
        ),
    )
    cold = cold_reason(plan.agent_log)
    if cold is not None:  # slower, not wrong: the person waiting should know why
        _say(stream, f"dcpqual run: ranks started cold, not forked: {cold}")
    gone = None
    markers: dict[int, NodeState | None] | None = None
    if options.node_rank != 0:
        wait_s = node_wait_s()
        if not _node_zero_gone(stream, options, evidence, out_dir, wait_s):
            # A node after node 1 waits out node 1's wait too: node 1 may write the bundle.
            waits = 1 if options.node_rank == 1 else 2
            code = _follow_node0(stream, out_dir, result, wait_s * waits)
            return code
        gone = NodeZeroGone(waited_s=wait_s, by_node=options.node_rank)
        markers = nodes.wait_for_nodes(out_dir, options.nnodes, 0.0)  # as they are now
    elif options.multi_node:
        markers = nodes.wait_for_nodes(out_dir, options.nnodes, node_wait_s())
    return _write_bundle(
        options, evidence, stream, plan, result, seen, held, scrubbed, markers, gone
    )


def _write_bundle(
    options: RunOptions,
    evidence: Evidence,
    stream: TextIO,
    plan: RunPlan,
    result: Launch,
    seen: Snapshot,
    held: ending.Hold,
    scrubbed: ScrubReport,
    markers: dict[int, NodeState | None] | None,
    gone: NodeZeroGone | None = None,
) -> int:
    """Node 0's ending (or node 1's, in place of a node 0 that is gone): set strays aside,
    gather the rank logs, write the bundle and verify it, and tell the verdict."""
    out_dir = plan.out_dir
    scrub = Scrub(
        changed=list(scrubbed.changed),
        renamed=list(scrubbed.renamed),
        in_place=list(scrubbed.in_place),
        removed=list(scrubbed.removed),
    )
    try:
        strays = evidence.set_aside(out_dir)  # a rank's `logs -> elsewhere` goes first
        collect_rank_logs(out_dir, options.world_size, options.nproc_per_node)
        result = held.name_in(result, seen)  # a signal held since torchrun exited interrupted it
        ctx = run_context(plan, result, nodes=markers)
        update = {"scrub": scrub, "strays": strays, "node_zero_gone": gone}
        ctx = replace(ctx, extra=ctx.extra.model_copy(update=update))
        receipt = evidence.finalize_bundle(out_dir, ctx)
    except ScrubFailed as exc:
        _say(sys.stderr, _secrets_left(out_dir, exc))
        return 1
    except DcpqualError:
        raise  # already one line, from the CLI
    except Exception as exc:  # a full disk, out of memory: the folder is scrubbed, say so
        _say(sys.stderr, _unfinished(out_dir, exc, scrubbed.removed))
        return 1
    problems = evidence.verify_bundle(out_dir)
    report(stream, out_dir, receipt, problems)
    from harness.launch.ci import report_to_ci

    report_to_ci(stream, receipt, out_dir / SUMMARY_NAME, problems=problems)
    if result.interrupted is not None:
        return result.interrupted.exit_code
    passed = receipt.verdict == "pass"
    clean = ctx.exit_code == 0 and not ctx.timed_out
    return 0 if passed and not problems and clean else 1


def _why(exc: Exception) -> str:
    """An error in a few words on one line: an OSError's own, else its type and first line."""
    if isinstance(exc, OSError) and (exc.strerror or str(exc)):
        return exc.strerror or str(exc)
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _scrub_stopped(out_dir: Path, exc: Exception) -> str:
    """One line: the scrub stopped short, so no bundle is written from what it left (a bundle
    would publish what it did not reach); the person must remove the folder's files."""
    return (
        f"dcpqual run: error: no bundle written in {out_dir}: the scrub of secrets stopped "
        f"({_why(exc)}), so its files may still hold a secret; remove them before sharing this "
        "folder"
    )


def _unfinished(out_dir: Path, exc: Exception, removed: tuple[str, ...] = ()) -> str:
    """One line: the bundle could not be finished, why, which of its files exist, and which
    files the scrub removed because it could not scrub them (a full disk)."""
    from harness.schema.layout import SUMS_NAME

    names = (RECEIPT_NAME, MERGED_JUNIT, SUMMARY_NAME, SUMS_NAME)
    written = [n for n in names if (out_dir / n).is_file()]
    missing = [n for n in names if n not in written]
    why = _why(exc)
    return (
        f"dcpqual run: error: could not finish the bundle in {out_dir}: {why}; written: "
        f"{', '.join(written) or 'none'}; not written: {', '.join(missing)} (the rank files "
        f"are scrubbed and kept{_except_removed(removed)})"
    )


def _except_removed(removed: tuple[str, ...]) -> str:
    if not removed:
        return ""
    them = "it" if len(removed) == 1 else "they"
    return f", except {len(removed)} removed because {them} could not be scrubbed: " + ", ".join(
        removed
    )


def _secrets_left(out_dir: Path, exc: ScrubFailed) -> str:
    """One line: the scrub could neither clean nor remove some files, so no bundle is written
    (a bundle would publish them); the person must remove them."""
    return (
        f"dcpqual run: error: no bundle written in {out_dir}: {exc}; remove them before "
        "sharing this folder"
    )


def node_wait_s() -> float:
    """How long the nodes wait for each other's markers and node 0's receipt: NODE_WAIT_S, or
    the seconds NODE_WAIT_ENV gives (a usage error unless a number above 0)."""
    text = os.environ.get(NODE_WAIT_ENV, "").strip()
    if not text:
        return NODE_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise UsageError(f"{NODE_WAIT_ENV} must be seconds above 0, got {text!r}")
    return value


def _node_zero_gone(
    stream: TextIO, options: RunOptions, evidence: Evidence, out_dir: Path, wait_s: float
) -> bool:
    """Node 1: True when it is to write the bundle itself, because node 0 wrote no receipt
    within `wait_s`, its marker never said its torchrun finished, and this node took node 0's
    claim on the folder (node 0's launcher holds it for its whole run, so it is gone)."""
    if options.node_rank != 1:
        return False
    try:
        if nodes.wait_for_receipt(out_dir, wait_s) is not None:
            return False
    except nodes.InvalidReceipt:
        return False  # node 0 finished a bundle; following it says what is wrong with it
    if nodes.finished(out_dir, 0):
        return False
    if not nodes.take_over(out_dir, wait_s, evidence.take_out_dir):
        return False
    _say(
        stream,
        f"dcpqual run: node 0 wrote no bundle in {out_dir} within {wait_s:g}s and never said "
        "its torchrun finished; its claim on the folder is free, so node 0 is gone: node 1 "
        "writes the bundle (a failing one)",
    )
    return True


def _follow_node0(
    stream: TextIO, out_dir: Path, result: Launch, wait_s: float | None = None
) -> int:
    """Node K > 0: node 0's verdict and ending (or node 1's bundle, where node 0 was gone),
    told on this node too. `wait_s`: how long to wait for it (default: `node_wait_s()`)."""
    from harness.evidence.short_summary import ending_lines

    wait_s = node_wait_s() if wait_s is None else wait_s
    try:
        receipt = nodes.wait_for_receipt(out_dir, wait_s)
    except nodes.InvalidReceipt as exc:
        _say(stream, f"dcpqual run: node 0's bundle in {out_dir} has no valid receipt: {exc}")
        return 1
    if receipt is None:
        _say(stream, f"dcpqual run: node 0 wrote no bundle in {out_dir} within {wait_s:g}s")
        return 1
    writer = rules.launch_node(receipt.run)  # node 1, where node 0 was gone
    _say(stream, f"dcpqual run: node {writer}'s bundle says {receipt.verdict.upper()}: {out_dir}")
    for line in ending_lines(receipt, out_dir):
        _say(stream, line)
    return 0 if receipt.verdict == "pass" and result.exit_code == 0 else 1
