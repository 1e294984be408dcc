"""The rank zygote: one process that imports torch, pytest and the harness once, then forks every
rank of its node on request (`python -m harness.rank.zygote SOCKET`).

Why: sixteen ranks importing torch at once on a few cores pay sixteen cold imports (half a
minute of wall time on two cores); sixteen forks of one preloaded process cost a tenth of a
second. torchrun stays the launcher: it starts a fork stub per rank (`harness.rank.forkstub`),
which hands the zygote its argv, cwd, environment and descriptors 0/1/2 and stands for the rank
towards torchrun (signals, exit status).

What a forked rank gets is what `python -m pytest` would have had: the stub's environment (as
`os.environ`), descriptors, cwd, `sys.argv`, `sys.orig_argv`, `sys.executable` and
`sys.path[0]`, a fresh `__main__`, its own session, default signal dispositions, torch's thread
count from the `OMP_NUM_THREADS` torchrun set, the random modules and torch's generator reseeded,
its own multiprocessing authkey, what the preload wrote into os.environ and what it warned
(re-issued under the rank's filters, `harness.core.preloaded`); then pytest runs as `-m pytest`
runs it, and an uncaught KeyboardInterrupt ends it by SIGINT as it ends the interpreter. It
also knows its torchrun agent and its stub (`harness.rank.parentage`): its parent is the zygote.
What the interpreter fixed at its start (options, `sys.flags`, `sys.warnoptions`, `sys.path`)
cannot change after it: a rank whose own would differ is not forked, its stub starts it cold.
What it cannot get: its own string-hash seed (one per interpreter: every forked rank shares the
zygote's; the launcher records that), and whatever torch read from the environment while it was
imported (the launcher starts the zygote with the ranks' environment for what matters, e.g.
OMP_NUM_THREADS).

Nothing here initializes CUDA or a process group, and no thread runs when it forks (both are
checked before every fork: a forked CUDA context or a thread's lock would be corrupt in the
child; CUDA counts as started once its driver library is loaded, which `is_available()` does
without `is_initialized()` saying so). A zygote with a thread alive after its preload (a BLAS
pool a user's OMP_NUM_THREADS started) or CUDA started by it forks nothing: it writes why next
to its socket and exits, and every stub then starts its rank's interpreter itself, as torchrun
would have. The zygote never ends a rank on its own
except when the rank's stub is gone, which is what torchrun's SIGKILL of the rank's group would
have been; its children outlive it otherwise, so the launcher's containment sees them as it
sees any rank.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import socket
import sys
import threading
import time
import types
import warnings
from dataclasses import dataclass, field
from typing import NoReturn

from harness.core import preloaded as handover
from harness.rank import interpreter, parentage
from harness.rank.forkwire import (
    Request,
    Startup,
    WireError,
    clear_stale,
    interpreter_options,
    peer_of,
    recv_request,
    send_reply,
    signal_rank,
    write_refusal,
)
from harness.rank.preload import HEAP_PLUGIN, PRELOAD, Preloaded, PreloadEnv, preload
from harness.rank.zygotelog import (
    Forked,
    NotPreloaded,
    Ready,
    Reaped,
    Refused,
    SentCold,
    format_event,
)

# Signals the zygote's own ending listens to; blocked across fork so the child starts clean.
_ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
MODULE = "harness.rank.zygote"
# The CUDA driver: the runtime loads it the first time CUDA is asked anything (is_available,
# device_count), and from then on the process holds driver state a forked child cannot use.
CUDA_DRIVER_LIBRARIES = ("libcuda.so",)


class ForkRefused(RuntimeError):
    """The zygote is not in a state a child may be forked from (a thread, CUDA)."""


def _show_in_log(warned: dict[str, list[warnings.WarningMessage]]) -> None:
    """The zygote's log shows what its preload warned, as the interpreter prints it."""
    for messages in warned.values():
        for m in messages:
            with contextlib.suppress(Exception):
                text = warnings.formatwarning(m.message, m.category, m.filename, m.lineno, m.line)
                sys.stderr.write(text)


def _native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def loaded_libraries(names: tuple[str, ...], maps: str = "/proc/self/maps") -> list[str]:
    """The files mapped into this process (`maps`) whose name is one of `names` or a version of
    it (`libcuda.so.1`)."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = set()
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = fields[5].removesuffix(" (deleted)")
        base = os.path.basename(path)
        if any(base == n or base.startswith(n + ".") for n in names):
            found.add(path)
    return sorted(found)


def cuda_refusal(torch: object | None, maps: str = "/proc/self/maps") -> str | None:
    """Why a child forked now could not use CUDA (None: CUDA never started here): torch says it
    initialized CUDA, or the CUDA driver is loaded (which `torch.cuda.is_available()` and
    `device_count()` do without `is_initialized()` turning true)."""
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "CUDA is initialized in the zygote; a forked child cannot use it"
    drivers = loaded_libraries(CUDA_DRIVER_LIBRARIES, maps)
    if drivers:
        return (
            f"the CUDA driver is loaded in the zygote ({', '.join(drivers)}): something asked "
            "CUDA about its devices during the preload, and a forked child cannot use the "
            "driver state that left"
        )
    return None


def fork_check() -> None:
    """Raise ForkRefused unless forking is safe: one thread, CUDA never started."""
    if threading.active_count() != 1 or _native_threads() != 1:
        raise ForkRefused(
            f"{_native_threads()} threads alive in the zygote ({threading.active_count()} "
            "Python), whose locks a forked child would inherit held (a BLAS thread pool "
            "started by the import where OMP_NUM_THREADS is not 1?)"
        )
    reason = cuda_refusal(sys.modules.get("torch"))
    if reason is not None:
        raise ForkRefused(reason)


def own_startup() -> Startup:
    """This zygote's startup, as a rank's is compared with it (before the preload changes
    anything)."""
    options = interpreter_options(list(sys.orig_argv), MODULE)
    return Startup.here(list(sys.orig_argv), [] if options is None else options)


def _adopt(request: Request, fds: list[int], preload_env: PreloadEnv | None = None) -> None:
    """In the child: become the process `python <argv>` would have started."""
    os.setsid()  # as torchrun starts each rank: its own session
    for fd, target in zip(fds, (0, 1, 2), strict=True):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(request.env)
    if preload_env is not None:
        preload_env.apply(os.environ, request.env)
    parentage.set_forked(
        parentage.Parentage(agent=request.agent_pid, stub=request.stub_pid, zygote=os.getppid())
    )
    os.chdir(request.cwd)
    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
    if request.startup.orig_argv:
        sys.orig_argv = list(request.startup.orig_argv)
    if request.startup.executable:
        sys.executable = request.startup.executable
    fresh = types.ModuleType("__main__")  # the interpreter's own, not the zygote's script
    fresh.__dict__["__builtins__"] = sys.modules["builtins"]
    sys.modules["__main__"] = fresh
    interpreter.draw_own_seeds(request.env)


def child_main(
    request: Request, fds: list[int], close: list[int], preloaded: Preloaded | None = None
) -> NoReturn:
    """In the child: become the rank, hand it what the preload warned, run it, exit."""
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
        _adopt(request, fds, None if preloaded is None else preloaded.env)
        if preloaded is not None:
            handover.hand_over(preloaded.warned, preloaded.modules)
        if HEAP_PLUGIN not in request.argv:  # nothing else re-issues them: before it runs
            handover.reissue(handover.STARTUP)
        code = interpreter.run_module(request.argv, "dcpqual zygote")
    except BaseException:
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    interpreter.wind_down()
    interpreter.leave(code)


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
    startup: Startup = field(default_factory=own_startup)
    preloaded: Preloaded = field(default_factory=Preloaded)  # what each child is handed
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
        pid, uid = peer_of(conn)
        if uid != os.getuid():  # not one of this run's stubs: it gets no fork and no reply
            print(f"dcpqual zygote: pid {pid} of uid {uid} connected; not this uid", flush=True)
            conn.close()
            return
        rank = _Rank(conn)
        try:
            request, fds = recv_request(conn)
        except (WireError, OSError) as exc:
            with contextlib.suppress(OSError):
                send_reply(conn, error=str(exc))
            conn.close()
            return
        try:
            cold = self._unfaithful(request)
            if cold is not None:
                print(format_event(SentCold(request.stub_pid, cold)), flush=True)
                send_reply(conn, cold=cold)
                conn.close()
                return
            rank.pid = self._fork(request, fds, conn)
            rank.pidfd = os.pidfd_open(rank.pid)
            self.ranks.append(rank)
            send_reply(conn, pid=rank.pid)
            said = request.env.get("RANK", "")
            number = int(said) if said.isdigit() else None
            print(format_event(Forked(rank.pid, request.stub_pid, number)), flush=True)
        except OSError:
            rank.stub_gone = True  # the stub left while we forked: the reap ends it
            if rank.pid is not None:
                self._kill(rank)
        finally:
            for fd in fds:
                os.close(fd)

    def _unfaithful(self, request: Request) -> str | None:
        """Why a rank forked for `request` would not be what its cold start would have been
        (None: it would be): its stub then starts it cold."""
        try:
            fork_check()
        except ForkRefused as exc:
            return str(exc)
        differ = request.startup.differences(self.startup)
        if differ:
            return "its interpreter would have started otherwise: " + "; ".join(differ)
        return None

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
                child_main(request, fds, close, self.preloaded)
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
        print(format_event(Reaped(rank.pid, status)), flush=True)
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
    print(format_event(Refused(reason)), flush=True)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m harness.rank.zygote SOCKET [MODULE,...]", file=sys.stderr)
        return 2
    modules = PRELOAD if len(argv) == 1 else tuple(m for m in argv[1].split(",") if m)
    t0 = time.monotonic()
    startup = own_startup()
    clear_stale(argv[0])  # an earlier zygote's note would send the stubs cold while this one loads
    gc.disable()  # nothing the preload builds is garbage (see harness.rank.heap)
    # Signals that come while preloading end the zygote at once (nothing to clean up yet).
    done = preload(modules)
    gc.enable()
    _show_in_log(done.warned)
    for failed in done.failed:
        print(format_event(NotPreloaded(failed.module, failed.error)), flush=True)
    try:
        fork_check()
    except ForkRefused as exc:
        refuse(argv[0], f"cannot fork ranks after the preload: {exc}")
        return EXIT_REFUSED
    zygote = Zygote(argv[0], startup, done)
    me = os.getpid()  # a child that unwinds to here must not close the zygote's socket
    try:
        ready = Ready(me, time.monotonic() - t0, tuple(done.loaded))
        print(format_event(ready), flush=True)
        zygote.serve()
    finally:
        if os.getpid() == me:
            zygote.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
