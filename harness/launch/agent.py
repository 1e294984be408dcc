"""torchelastic's own agent, in torchrun's place, its ranks started as a function in children of
multiprocessing's forkserver:

    python -m harness.launch.agent --preload MODULE,MODULE -- TORCHRUN_FLAGS -m MODULE ARGS

The flags after `--` are torchrun's, parsed by torchrun's own parser into torchrun's own launch
config (`torch.distributed.run.config_from_args`, `--standalone` resolved as `torchrun` resolves
it), so the rendezvous, the ranks' environment, the log folder layout, the error files and the
agent's own failure report are torchelastic's. Only the start differs: `start_method` is
`forkserver`, whose server imports the preload list once, before the first rank is asked for,
and each rank is `harness.rank.forkserved.run`, which makes the forked child the interpreter
`python -u -m MODULE ARGS` would have been.

This process imports the preload list itself (torchelastic needs torch here anyway) and starts
the forkserver as a fork of itself (`harness.launch.forkserver_start`), so the node imports
torch, pytest and the harness once, not once here and again in a fresh server; where a thread is
alive after its preload (a fork would copy none of it), the server is a fresh interpreter that
imports the list itself, as multiprocessing starts it. The server and multiprocessing's resource
tracker are this process's children; they are stopped before it exits, whatever the ending, so
nothing it started outlives the launch.

Before the first rank, a child of the server says whether the server may fork ranks at all
(`harness.rank.forksafety`: one thread, CUDA never started). Where it may not, this process
says why on its log and becomes torchrun itself (the same flags and rank command), whose ranks
start cold: slower, never wrong.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from multiprocessing import forkserver, resource_tracker, util
from pathlib import Path

from harness.errors import UsageError
from harness.launch import forkserver_start
from harness.rank import forksafety
from harness.rank.preload import FORKSERVER_PRELOAD_MODULE, PRELOAD_LIST_ENV

AGENT_MODULE = "harness.launch.agent"
RANK_ENTRY_MODULE = "harness.rank.forkserved"
# How the agent's log says its ranks start cold (the reason follows).
STARTED_COLD = "dcpqual agent: ranks start cold, not forked: "
# How the agent's log says its forkserver is a fresh interpreter, not its own fork (why follows).
STARTED_FRESH = "dcpqual agent: forkserver started fresh, not forked from the agent: "
_NPROC = re.compile(r"^--nproc[-_]per[-_]node(?:=(?P<value>.*))?$")
_SIGNALS = re.compile(r"^--signals[-_]to[-_]handle(?:=(?P<value>.*))?$")
# What torchelastic's agent puts in its environment as it launches (`launch_agent`), for the
# ranks to inherit: `--signals-to-handle`, torchrun's default where not given.
SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"
DEFAULT_SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def cold_reason(agent_log: Path) -> str | None:
    """Why the agent of `agent_log` started its ranks cold (None: it said nothing of it, or the
    log cannot be read): the reason on its line, which comes before any rank's output."""
    try:
        with agent_log.open("rb") as log:
            for raw in log:
                line = raw.decode(errors="replace").rstrip("\n")
                if line.startswith(STARTED_COLD):
                    return line[len(STARTED_COLD) :]
    except OSError:
        return None
    return None


def agent_argv(
    torchrun: Sequence[str], rank_argv: Sequence[str], preload: Sequence[str]
) -> tuple[str, ...]:
    """The command of torchelastic's agent (`harness.launch.agent`) in place of torchrun's: the
    same flags after its own `--preload`, the same rank command."""
    python, dash_m, module, *flags = torchrun
    assert (dash_m, module) == ("-m", "torch.distributed.run"), torchrun
    return (python, "-m", AGENT_MODULE, "--preload", ",".join(preload), "--", *flags, *rank_argv)


def split_argv(argv: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(modules to preload, torchrun's argv) from `--preload A,B -- TORCHRUN_ARGV`."""
    args = list(argv)
    preload: tuple[str, ...] = ()
    if args[:1] == ["--preload"]:
        if len(args) < 2:
            raise UsageError("--preload needs a comma-separated list of modules")
        preload = tuple(m for m in args[1].split(",") if m)
        args = args[2:]
    if args[:1] != ["--"]:
        raise UsageError("usage: python -m harness.launch.agent [--preload M,M] -- TORCHRUN_ARGS")
    return preload, tuple(args[1:])


def _flag(torchrun_argv: Sequence[str], flag: re.Pattern[str]) -> str | None:
    """The value of torchrun's `flag` (`--flag=V` or `--flag V`), None where not given."""
    for i, arg in enumerate(torchrun_argv):
        match = flag.match(arg)
        if match is None:
            continue
        value = match["value"]
        if value is None and i + 1 < len(torchrun_argv):
            value = torchrun_argv[i + 1]
        return value
    return None


def local_ranks(torchrun_argv: Sequence[str]) -> int | None:
    """`--nproc-per-node` as a number where it is given as one (torchrun also takes words)."""
    value = _flag(torchrun_argv, _NPROC)
    return int(value) if value is not None and value.isdigit() else None


def signals_to_handle(torchrun_argv: Sequence[str]) -> str:
    """`--signals-to-handle` as torchrun reads it, its default where not given."""
    value = _flag(torchrun_argv, _SIGNALS)
    return DEFAULT_SIGNALS_TO_HANDLE if value is None else value


def start_forkserver(preload: Sequence[str], torchrun_argv: Sequence[str]) -> bool:
    """Preload, then start the forkserver, in the environment the ranks will see as far as
    their imports can read it: torchrun sets OMP_NUM_THREADS=1 for more than one local rank,
    and torch reads it as it is imported. Returns whether OMP_NUM_THREADS was set here (for
    torchrun to set it itself where the ranks start cold). torchelastic's agent also puts the
    signals it handles in the environment as it launches, later: a cold rank inherits that, so
    the preload's environment has it from the start."""
    ranks = local_ranks(torchrun_argv)
    threads_set = "OMP_NUM_THREADS" not in os.environ and (ranks is None or ranks > 1)
    if threads_set:
        os.environ["OMP_NUM_THREADS"] = "1"
    os.environ[SIGNALS_ENV] = signals_to_handle(torchrun_argv)
    listed = ",".join(preload)
    os.environ[PRELOAD_LIST_ENV] = listed
    try:
        importlib.import_module(FORKSERVER_PRELOAD_MODULE)  # the preload, here (reads the list)
        importlib.import_module(RANK_ENTRY_MODULE)
        forkserver.set_forkserver_preload([FORKSERVER_PRELOAD_MODULE, RANK_ENTRY_MODULE])
        threads = forksafety.native_threads()
        if threads == 1:
            with forkserver_start.forked_from_here():
                forkserver.ensure_running()
        else:  # a fork would hold those threads' locks and none of the threads
            alive = "an unknown number of" if threads is None else str(threads)
            why = f"{alive} threads alive in the agent after its preload"
            print(f"{STARTED_FRESH}{why}", file=sys.stderr, flush=True)
            os.environ[PRELOAD_LIST_ENV] = listed  # for the fresh server's own preload
            forkserver.ensure_running()
    finally:
        os.environ.pop(PRELOAD_LIST_ENV, None)
    return threads_set


def forkserver_refusal() -> str | None:
    """Why the forkserver may not fork ranks (None: it may), as a child it forks finds it; the
    wait for the answer is the wait for the server's preload."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    answer, send = context.Pipe(duplex=False)
    probe = context.Process(target=forksafety.answer_refusal, args=(send,), name="fork-probe")
    probe.start()
    send.close()
    try:
        reason: str | None = answer.recv()
    except EOFError:
        reason = f"the forkserver's probe child ended without an answer (exit {probe.exitcode})"
    finally:
        answer.close()
        probe.join()
    return reason


def become_torchrun(torchrun_argv: Sequence[str], reason: str, threads_set: bool) -> None:
    """Stop the forkserver and exec torchrun with the same flags: its ranks start cold."""
    print(f"{STARTED_COLD}{reason}", file=sys.stderr, flush=True)
    stop_helpers()
    if threads_set:
        del os.environ["OMP_NUM_THREADS"]  # torchrun sets it, and says so, as it does cold
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *torchrun_argv])


def stop_helpers() -> None:
    """Stop multiprocessing's forkserver and resource tracker (CPython's own stop functions):
    they are this process's children and would otherwise outlive the launch. Between the two,
    the finalizers run as at exit (the semaphores unlinked, the forkserver's folder removed), so
    the tracker stops with nothing left to clean up and warn about."""
    forkserver._forkserver._stop()  # type: ignore[attr-defined]
    util._run_finalizers()  # type: ignore[attr-defined]
    resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]


def signal_session(pid: int, sig: signal.Signals) -> None:
    """`sig` to the rank's session, as torchrun's subprocess handler signals a cold rank's
    (`os.killpg`), so the helper processes it started get it too; to the rank alone where it
    has no session of its own yet (still in the forkserver's group)."""
    with contextlib.suppress(ProcessLookupError):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            os.kill(pid, sig)


def signal_rank_sessions() -> None:
    """Make the agent end each rank's session, not only its pid, wherever it signals a rank:
    torch's process context terminates the survivors of a failed rank
    (`Process.terminate`, through the forkserver's `Popen`), and torchelastic's worker context
    closes the rest (on a signal to the agent, at the end of the launch). Their logic stays
    torch's own; each `os.kill` of a rank becomes a `signal_session`. And a rank that exits 0
    without returning is a success, as torchrun reads a cold rank's exit 0."""
    from multiprocessing import popen_forkserver

    from torch.distributed.elastic import multiprocessing as elastic_mp
    from torch.distributed.elastic.multiprocessing import api

    class SessionPopen(popen_forkserver.Popen):
        def _send_signal(self, sig: int) -> None:
            if self.returncode is None:
                signal_session(self.pid, signal.Signals(sig))

    popen_forkserver.Popen = SessionPopen  # type: ignore[misc]  # what forkserver starts make

    class RankSessions(api.MultiprocessContext):
        def _poll(self) -> api.RunProcsResult | None:
            """A rank that ended by `os._exit(0)` (a cold rank's success to torchrun) handed
            back no return value, so torchelastic would wait for one forever, and the ranks
            that did return would wait for it: its value is None."""
            for local_rank, proc in enumerate(self._pc.processes if self._pc else ()):
                handed = local_rank in self._return_values or not self._ret_vals[local_rank].empty()
                if not handed and proc.exitcode == 0:  # alive until their values are read
                    self._return_values[local_rank] = None
            return super()._poll()

        def _close(self, death_sig: signal.Signals, timeout: int = 30) -> None:
            if self._pc is None:
                return
            kill = api._get_kill_signal()
            for proc in self._pc.processes:
                if proc.is_alive():
                    signal_session(proc.pid, death_sig)
            end = time.monotonic() + timeout
            for proc in self._pc.processes:
                proc.join(max(0.0, end - time.monotonic()))
            for proc in self._pc.processes:
                if proc.is_alive():
                    signal_session(proc.pid, kill)
                    proc.join(timeout)

    elastic_mp.MultiprocessContext = RankSessions  # type: ignore[misc]  # start_processes builds it


def launch_ranks(torchrun_argv: Sequence[str], threads_set: bool = False) -> None:
    """torchrun's launch of `torchrun_argv`, each rank `forkserved.run` in a forkserver child;
    torchrun's own where the forkserver may not fork them."""
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    from harness.rank import forkserved

    reason = forkserver_refusal()
    if reason is not None:
        become_torchrun(torchrun_argv, reason, threads_set)
    args = parse_args(list(torchrun_argv))  # type: ignore[no-untyped-call]
    if args.standalone:  # as torchrun's own `run` resolves it
        args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    config, _, rank_argv = config_from_args(args)
    config.start_method = "forkserver"
    signal_rank_sessions()
    elastic_launch(config, forkserved.run)(str(os.getpid()), *rank_argv)


def main(argv: Sequence[str] | None = None) -> int:
    preload, torchrun_argv = split_argv(sys.argv[1:] if argv is None else argv)
    threads_set = start_forkserver(preload, torchrun_argv)
    try:
        from torch.distributed.elastic.multiprocessing.errors import record

        record(launch_ranks)(torchrun_argv, threads_set)  # its error file, as torchrun's `main`
    finally:
        stop_helpers()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UsageError as exc:
        print(f"dcpqual agent: error: {exc}", file=sys.stderr)
        sys.exit(2)
