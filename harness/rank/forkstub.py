"""What torchrun starts for each rank when ranks are forked: `python -m harness.rank.forkstub --
-m pytest ...`. It asks the zygote (`harness.rank.zygote`) to fork the rank with this process's
argv, cwd, environment and descriptors 0/1/2, then stands for it towards torchrun:

- SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1/2 are forwarded to the rank's process group (the
  rank leads its own), as torchrun's killpg of a cold rank reaches its helper processes too;
  one that comes before the stub asked for its rank (the zygote still preloading) ends the stub
  at once with the signal's default action, as it would have ended a cold rank still starting;
- it exits with the rank's exit code, or dies of the rank's signal, so torchrun sees what it
  would have seen from the rank itself (its error file comes through the rank's environment);
- if the stub dies (torchrun SIGKILLs it after its shutdown timeout), the zygote SIGKILLs the
  rank's group, as torchrun's SIGKILL of the rank's group would have;
- if the zygote dies first, the rank cannot be reaped: the stub says so in one line, ends the
  rank (SIGTERM, then SIGKILL) and exits 1; so it does, before it hands over anything, where
  what listens at the socket is not the launcher's zygote (another pid or user: SO_PEERCRED);
- if the zygote refused to fork at all (a thread alive after its preload, which it writes next
  to its socket before it exits), or will not fork this rank (its interpreter would have started
  differently from the zygote's: other options, flags or sys.path), the stub becomes the rank:
  it execs the interpreter with the rank's argv, the ordinary cold start torchrun would have
  made.

Standard library only (`-X importtime` shows no third-party module): 16 of these start at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import time

from harness.rank.forkwire import (
    SOCKET_ENV,
    ZYGOTE_PID_ENV,
    Replies,
    Request,
    Startup,
    WireError,
    interpreter_options,
    not_the_zygote,
    peer_of,
    read_refusal,
    send_request,
    signal_rank,
)

FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
# How long the stub waits for the zygote's socket to accept (the zygote imports torch meanwhile;
# 16 ranks' stubs start while it does). The launcher ends the tree sooner if the zygote dies.
CONNECT_WAIT_S = 600.0
# After the zygote died: how long the orphaned rank may take to end on SIGTERM.
ORPHAN_GRACE_S = 5.0
EXIT_ZYGOTE_LOST = 1
MODULE = "harness.rank.forkstub"


def _say(text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"dcpqual forkstub: {text}\n".encode())


def _gone(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def connect(path: str, wait_s: float, zygote_pid: int | None = None) -> socket.socket | None:
    """Connect once the zygote listens; None where it refused to fork (its note says why); give
    up at `wait_s` or once the zygote is gone without a note. A note whose pid is not
    `zygote_pid` was left by another zygote at this path and is not believed."""
    deadline = time.monotonic() + wait_s

    def refused() -> bool:
        note = read_refusal(path)
        return note is not None and (zygote_pid is None or note.pid == zygote_pid)

    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if refused():
                return None
            gone = _gone(zygote_pid)
            if gone and refused():  # the note is written before it exits
                return None
            if time.monotonic() >= deadline or gone:
                raise
            time.sleep(0.05)


def _options() -> list[str]:
    """This stub's own interpreter options (torchrun's `-u`): the rank's."""
    options = interpreter_options(list(sys.orig_argv), MODULE)
    return ["-u"] if options is None else options


def cold_argv(argv: list[str]) -> list[str]:
    """The interpreter command torchrun would have run for the rank: this interpreter with this
    stub's own interpreter options, then the rank's argv."""
    return [sys.executable, *_options(), *argv]


def rank_startup(argv: list[str]) -> Startup:
    """The rank's interpreter as torchrun would have started it: this stub's, its `-m` ours."""
    first = sys.orig_argv[0] if sys.orig_argv else sys.executable
    return Startup.here([first, *_options(), *argv], _options())


def become_the_rank(argv: list[str]) -> None:
    """Exec the rank's interpreter in this process (the pid torchrun started and watches)."""
    for name in (SOCKET_ENV, ZYGOTE_PID_ENV):
        os.environ.pop(name, None)
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    command = cold_argv(argv)
    try:
        os.execv(command[0], command)
    except OSError as exc:
        _say(f"cannot start the rank's interpreter {command[0]}: {exc}")
        os._exit(EXIT_ZYGOTE_LOST)


def die_of(signum: int) -> None:
    """End this process with `signum`'s default action, as it would end a cold rank."""
    with contextlib.suppress(OSError, ValueError):  # SIGKILL's disposition is fixed
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # a signal whose default action is not to end the process


class _Child:
    """The forked rank as the stub knows it. A signal before the stub asked for it ends the
    stub (the rank has not begun); one between the request and its pid is held."""

    def __init__(self) -> None:
        self.asked = False
        self.pid: int | None = None
        self.pidfd: int | None = None
        self.pending: list[int] = []

    def on_signal(self, signum: int, frame: object) -> None:
        if not self.asked:
            die_of(signum)
        elif self.pid is None:
            self.pending.append(signum)
        else:
            self.kill(signum)

    def not_forked(self) -> None:
        """The zygote will not fork it: a held signal ends the stub before its rank begins."""
        self.asked = False
        for signum in self.pending:
            die_of(signum)

    def adopt(self, pid: int) -> None:
        self.pid = pid
        with contextlib.suppress(OSError):
            self.pidfd = os.pidfd_open(pid)
        for signum in self.pending:
            self.kill(signum)
        self.pending.clear()

    def kill(self, signum: int) -> None:
        """To the rank's process group, as torchrun's killpg of a cold rank (`signal_rank`)."""
        with contextlib.suppress(OSError):
            if self.pidfd is not None and self.pid is not None:
                signal_rank(self.pid, self.pidfd, signum)
            elif self.pid is not None:
                os.kill(self.pid, signum)

    def end(self, grace_s: float) -> None:
        """SIGTERM, wait up to `grace_s` for it to exit, then SIGKILL."""
        self.kill(signal.SIGTERM)
        if self.pidfd is not None and select.select([self.pidfd], [], [], grace_s)[0]:
            return
        self.kill(signal.SIGKILL)


def exit_like(status: int) -> None:
    """Leave as the child did: the same exit code, or death by the same signal."""
    if os.WIFSIGNALED(status):
        die_of(os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    path = os.environ.get(SOCKET_ENV)
    if not path:
        _say(f"{SOCKET_ENV} is not set: not started by a dcpqual launcher that runs a zygote")
        os._exit(2)
    zygote = os.environ.get(ZYGOTE_PID_ENV, "")
    if not zygote.isdigit():
        _say(f"{ZYGOTE_PID_ENV} is not a pid ({zygote!r}): no way to know the rank zygote")
        os._exit(2)
    child = _Child()
    for sig in FORWARDED:
        signal.signal(sig, child.on_signal)
    try:
        sock = connect(path, CONNECT_WAIT_S, int(zygote))
        stranger = None if sock is None else not_the_zygote(peer_of(sock), int(zygote))
    except OSError as exc:
        _say(f"cannot reach the rank zygote at {path}: {exc}")
        os._exit(EXIT_ZYGOTE_LOST)
    if stranger is not None:  # handed nothing: not the rank's env, descriptors or status
        _say(f"what listens at {path} is not the rank zygote ({stranger}); the rank is lost")
        os._exit(EXIT_ZYGOTE_LOST)
    if sock is None:
        become_the_rank(argv)
        return
    request = Request(
        argv=tuple(argv),
        cwd=os.getcwd(),
        env=dict(os.environ),
        stub_pid=os.getpid(),
        agent_pid=os.getppid(),
        startup=rank_startup(argv),
    )
    replies = Replies(sock)
    try:
        child.asked = True  # a signal from here on is held for the rank
        send_request(sock, request)
        while True:
            reply = replies.next()
            if reply is None:
                break
            if "error" in reply:
                _say(f"the rank zygote refused to fork this rank: {reply['error']}")
                os._exit(EXIT_ZYGOTE_LOST)
            if "cold" in reply:
                sock.close()
                child.not_forked()
                become_the_rank(argv)
                return
            if "pid" in reply:
                child.adopt(int(str(reply["pid"])))
            if "status" in reply:
                exit_like(int(str(reply["status"])))
    except (OSError, WireError, ValueError) as exc:
        _say(f"lost the rank zygote's connection: {exc}")
    who = f"rank pid {child.pid}" if child.pid is not None else "the rank"
    _say(f"the rank zygote at {path} went away before {who} exited; ending it")
    if child.pid is not None:
        child.end(ORPHAN_GRACE_S)
    os._exit(EXIT_ZYGOTE_LOST)


if __name__ == "__main__":
    main(sys.argv[1:])
