"""The rank zygote: one process that imports torch, pytest and the harness once, then forks every
rank of its node on request (`python -m harness.rank.zygote SOCKET`).

Why: sixteen ranks importing torch at once on a few cores pay sixteen cold imports (half a
minute of wall time on two cores); sixteen forks of one preloaded process cost a tenth of a
second. torchrun stays the launcher: it starts a fork stub per rank (`harness.rank.forkstub`),
which hands the zygote its argv, cwd, environment and descriptors 0/1/2 and stands for the rank
towards torchrun (signals, exit status).

What a forked rank gets is what `python -m pytest` would have had: the stub's environment (as
`os.environ`), descriptors, cwd, `sys.argv` and `sys.path[0]`, its own session, default signal
dispositions, torch's thread count from the `OMP_NUM_THREADS` torchrun set, the random modules
reseeded; then pytest runs through `runpy` as `-m pytest` runs it. It also knows its torchrun
agent and its stub (`harness.rank.parentage`): its parent is the zygote. What it cannot get: its
own string-hash seed (one per interpreter: every forked rank shares the zygote's; the launcher
records that), and whatever torch read from the environment while it was imported (the launcher
starts the zygote with the ranks' environment for what matters, e.g. OMP_NUM_THREADS).

Nothing here initializes CUDA or a process group, and no thread runs when it forks (both are
checked before every fork: a forked CUDA context or a thread's lock would be corrupt in the
child). A zygote with a thread alive after its preload (a BLAS pool a user's OMP_NUM_THREADS
started) forks nothing: it writes why next to its socket and exits, and every stub then starts
its rank's interpreter itself, as torchrun would have. The zygote never ends a rank on its own
except when the rank's stub is gone, which is what torchrun's SIGKILL of the rank's group would
have been; its children outlive it otherwise, so the launcher's containment sees them as it
sees any rank.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import NoReturn

from harness.rank import parentage
from harness.rank.forkwire import (
    Request,
    WireError,
    clear_stale,
    recv_request,
    send_reply,
    signal_rank,
    write_refusal,
)

# What every rank imports before its first test (its plugins' and the suites' conftests'
# imports), never anything a rank imports only inside a test (torch._dynamo, vLLM: the capture
# detectors report those imports): the forked rank finds them in sys.modules. pytest rewrites
# the asserts of the modules it loads as plugins or conftests, so those are not preloaded.
PRELOAD: tuple[str, ...] = (
    "torch",
    "torch.distributed",
    "pytest",
    "_pytest.junitxml",
    "_pytest.runner",
    "harness.rank.agreement",
    "harness.rank.bootstrap",
    "harness.rank.fixtures",
    "harness.rank.rankfiles",
    "harness.rank.sidechannel",
    "harness.rank.subworld",
    "harness.rank.watchdog",
    "harness.rank.worldbreak",
    "harness.schema.plan",
    "harness.schema.rank_record",
    "harness.schema.capture",
)
# Signals the zygote's own ending listens to; blocked across fork so the child starts clean.
_ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
READY_LINE = "dcpqual zygote: ready"
FORKED_LINE = "dcpqual zygote: forked"  # one line per rank, so the launcher can say how many
# One line per rank it reaped: the launcher's proof that a rank too short-lived for its process
# scans to see has exited.
REAPED_LINE = "dcpqual zygote: reaped"
REFUSED_LINE = "dcpqual zygote: not forking"


class ForkRefused(RuntimeError):
    """The zygote is not in a state a child may be forked from (a thread, CUDA)."""


def preload(modules: tuple[str, ...] = PRELOAD) -> list[str]:
    for name in modules:
        importlib.import_module(name)
    gc.freeze()  # the preloaded heap: shared copy-on-write, never walked by the children's gc
    return list(modules)


def _native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def fork_check() -> None:
    """Raise ForkRefused unless forking is safe: one thread, CUDA never initialized."""
    if threading.active_count() != 1 or _native_threads() != 1:
        raise ForkRefused(
            f"{_native_threads()} threads alive in the zygote ({threading.active_count()} "
            "Python), whose locks a forked child would inherit held (a BLAS thread pool "
            "started by the import where OMP_NUM_THREADS is not 1?)"
        )
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise ForkRefused("CUDA is initialized in the zygote; a forked child cannot use it")


def _exit_code(exc: SystemExit) -> int:
    """What the interpreter exits with for this SystemExit (printing a non-int code)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _adopt(request: Request, fds: list[int]) -> None:
    """In the child: become the process `python <argv>` would have started."""
    os.setsid()  # as torchrun starts each rank: its own session
    for fd, target in zip(fds, (0, 1, 2), strict=True):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(request.env)
    parentage.set_forked(
        parentage.Parentage(agent=request.agent_pid, stub=request.stub_pid, zygote=os.getppid())
    )
    os.chdir(request.cwd)
    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
    threads = request.env.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))  # torch read the variable at import, in the zygote
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _run_module(argv: tuple[str, ...]) -> int:
    """`python -m MODULE ARGS` in this process; returns the exit code the interpreter would."""
    import runpy

    if len(argv) < 2 or argv[0] != "-m":
        print(f"dcpqual zygote: can only run `-m MODULE ...`, got {list(argv)!r}", file=sys.stderr)
        return 2
    sys.argv = [argv[1], *argv[2:]]  # runpy sets argv[0] to the module's file
    try:
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return _exit_code(exc)
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    return 0


def _finish(code: int) -> NoReturn:
    """The interpreter's own exit, minus unwinding into the zygote's loop: join non-daemon
    threads, run atexit, flush."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        import atexit

        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


def child_main(request: Request, fds: list[int], close: list[int]) -> NoReturn:
    code = 1
    try:
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        _adopt(request, fds)
        code = _run_module(request.argv)
    except BaseException:
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    _finish(code)


@dataclass
class _Rank:
    conn: socket.socket
    pid: int | None = None
    pidfd: int | None = None
    stub_gone: bool = False


@dataclass
class Zygote:
    """The serving loop: accept, fork, reap, report; SIGTERM/SIGINT/SIGHUP end it."""

    path: str
    listener: socket.socket = field(init=False)
    ranks: list[_Rank] = field(default_factory=list)

    def __post_init__(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(256)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._stop = False

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stop = True

    def serve(self) -> None:
        for sig in _ENDING:
            signal.signal(sig, self._on_signal)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        while not self._stop:
            watched = [self.listener.fileno(), self._wake_r]
            for rank in self.ranks:
                if not rank.stub_gone:
                    watched.append(rank.conn.fileno())
                if rank.pidfd is not None:
                    watched.append(rank.pidfd)
            ready, _, _ = select.select(watched, [], [])
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 64)
            if self.listener.fileno() in ready:
                self._accept()
            for rank in list(self.ranks):
                if rank.pidfd is not None and rank.pidfd in ready:
                    self._reap(rank)
                elif not rank.stub_gone and rank.conn.fileno() in ready:
                    self._stub_spoke(rank)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        rank = _Rank(conn)
        try:
            request, fds = recv_request(conn)
        except (WireError, OSError) as exc:
            with contextlib.suppress(OSError):
                send_reply(conn, error=str(exc))
            conn.close()
            return
        try:
            try:
                fork_check()
            except ForkRefused as exc:
                send_reply(conn, error=str(exc))
                conn.close()
                return
            rank.pid = self._fork(request, fds, conn)
            rank.pidfd = os.pidfd_open(rank.pid)
            self.ranks.append(rank)
            send_reply(conn, pid=rank.pid)
            said = request.env.get("RANK", "?")
            print(
                f"{FORKED_LINE} pid {rank.pid} for stub {request.stub_pid} rank {said}", flush=True
            )
        except OSError:
            rank.stub_gone = True  # the stub left while we forked: the reap ends it
            if rank.pid is not None:
                self._kill(rank)
        finally:
            for fd in fds:
                os.close(fd)

    def _fork(self, request: Request, fds: list[int], conn: socket.socket) -> int:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        # The child keeps none of the zygote's descriptors: a stub sees EOF only once every
        # copy of the zygote's end of its connection is closed.
        close = [self.listener.fileno(), self._wake_r, self._wake_w, conn.fileno()]
        for rank in self.ranks:
            close.append(rank.conn.fileno())
            if rank.pidfd is not None:
                close.append(rank.pidfd)
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _ENDING)
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                child_main(request, fds, close)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return pid

    def _kill(self, rank: _Rank) -> None:
        """SIGKILL the rank's group, as torchrun's killpg of a cold rank would (not yet
        reaped while its pidfd is open: its pid is not reused)."""
        with contextlib.suppress(OSError):
            if rank.pidfd is not None and rank.pid is not None:
                signal_rank(rank.pid, rank.pidfd, signal.SIGKILL)

    def _stub_spoke(self, rank: _Rank) -> None:
        """Stubs send nothing after their request: readable means gone (EOF)."""
        try:
            data = rank.conn.recv(64)
        except OSError:
            data = b""
        if data:
            return
        rank.stub_gone = True
        self._kill(rank)  # as torchrun's SIGKILL of the rank's group would have

    def _reap(self, rank: _Rank) -> None:
        assert rank.pid is not None and rank.pidfd is not None
        _, status = os.waitpid(rank.pid, 0)
        os.close(rank.pidfd)
        rank.pidfd = None
        print(f"{REAPED_LINE} pid {rank.pid} status {status}", flush=True)
        if not rank.stub_gone:
            with contextlib.suppress(OSError):
                send_reply(rank.conn, status=status)
        rank.conn.close()
        self.ranks.remove(rank)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        for rank in self.ranks:
            rank.conn.close()  # the stubs see the zygote gone; their ranks stay to be contained


EXIT_REFUSED = 3


def refuse(path: str, reason: str) -> None:
    """Say why no rank will be forked, where the stubs look before they give up on the socket,
    and in the log."""
    write_refusal(path, reason)
    print(f"{REFUSED_LINE}: {reason}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m harness.rank.zygote SOCKET [MODULE,...]", file=sys.stderr)
        return 2
    modules = PRELOAD if len(argv) == 1 else tuple(m for m in argv[1].split(",") if m)
    t0 = time.monotonic()
    clear_stale(argv[0])  # an earlier zygote's note would send the stubs cold while this one loads
    gc.disable()  # nothing the preload builds is garbage (see harness.rank.heap)
    # Signals that come while preloading end the zygote at once (nothing to clean up yet).
    loaded = preload(modules)
    gc.enable()
    try:
        fork_check()
    except ForkRefused as exc:
        refuse(argv[0], f"cannot fork ranks after the preload: {exc}")
        return EXIT_REFUSED
    zygote = Zygote(argv[0])
    me = os.getpid()  # a child that unwinds to here must not close the zygote's socket
    try:
        print(
            f"{READY_LINE} pid {me}, {len(loaded)} modules preloaded in "
            f"{time.monotonic() - t0:.1f}s: {', '.join(loaded)}",
            flush=True,
        )
        zygote.serve()
    finally:
        if os.getpid() == me:
            zygote.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
