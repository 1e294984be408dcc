"""The wire between a rank's fork stub and the zygote: one request, then the child's pid, then
its wait status, over a Unix stream socket.

Standard library only: the stub imports this and nothing heavier, so a rank's own start costs an
interpreter and a socket, not an `import torch`.

Request (stub -> zygote): one byte carrying the stub's descriptors 0, 1 and 2 (SCM_RIGHTS), then
a length-prefixed JSON object {argv, cwd, env, stub_pid, agent_pid, startup} (the stub's parent:
the torchrun agent; `startup`: what the rank's interpreter would have been started as).
Replies (zygote -> stub): JSON lines, {"pid": N} once the child is forked, then {"status": W}
(its raw wait status) when the zygote has reaped it; {"error": TEXT} instead when the zygote
cannot fork it, or {"cold": TEXT} when it will not because the forked rank would differ from a
cold one (the stub then starts the rank's interpreter itself).

Both ends signal the forked rank the same way (`signal_rank`): its process group, as torchrun's
`killpg` of a cold rank reaches the helper processes it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
from dataclasses import dataclass, field

# Environment variables the launcher sets for the stubs (and so for the ranks).
SOCKET_ENV = "DCPQUAL_ZYGOTE_SOCKET"
ZYGOTE_PID_ENV = "DCPQUAL_ZYGOTE_PID"
_LENGTH = struct.Struct("!I")
MAX_REQUEST = 16 << 20


class WireError(RuntimeError):
    """The other side broke the protocol or went away mid-message."""


def interpreter_options(orig_argv: list[str], module: str) -> list[str] | None:
    """The interpreter options in `orig_argv` before `-m module` (None: not started so)."""
    for i in range(1, len(orig_argv) - 1):
        if orig_argv[i] == "-m" and orig_argv[i + 1] == module:
            return orig_argv[1:i]
    return None


def _shown(value: object) -> str:
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


@dataclass(frozen=True)
class Startup:
    """What an interpreter took from its command line and environment when it started, which
    nothing can change later: a forked rank has its zygote's, so the zygote forks a rank only
    where the rank's own would be the same. `orig_argv` and `executable` are the rank's own
    (set in the forked child); the rest are compared."""

    orig_argv: tuple[str, ...] = ()
    executable: str = ""
    options: tuple[str, ...] = ()  # between the interpreter and `-m`: -u, -X, -W, -O, ...
    flags: tuple[int, ...] = ()  # sys.flags (the options and the PYTHON* variables)
    warnoptions: tuple[str, ...] = ()
    path: tuple[str, ...] = ()  # sys.path after its first entry (the working directory)

    @classmethod
    def here(cls, orig_argv: list[str], options: list[str]) -> Startup:
        """This interpreter's, with the given argv and options."""
        return cls(
            orig_argv=tuple(orig_argv),
            executable=sys.executable,
            options=tuple(options),
            flags=tuple(int(x) for x in sys.flags),
            warnoptions=tuple(sys.warnoptions),
            path=tuple(sys.path[1:]),
        )

    def differences(self, zygote: Startup) -> list[str]:
        """What a rank started as `self` would see differently forked from a zygote started as
        `zygote`: one phrase each, empty where nothing differs."""
        said = []
        for name in ("executable", "options", "warnoptions", "path"):
            mine, theirs = getattr(self, name), getattr(zygote, name)
            if mine != theirs:
                said.append(f"sys.{name} {_shown(mine)}, the zygote's {_shown(theirs)}")
        names = getattr(type(sys.flags), "__match_args__", ())
        for i, (mine, theirs) in enumerate(zip(self.flags, zygote.flags, strict=False)):
            if mine != theirs:
                name = names[i] if i < len(names) else str(i)
                said.append(f"sys.flags.{name} {mine}, the zygote's {theirs}")
        if len(self.flags) != len(zygote.flags):
            said.append(f"{len(self.flags)} sys.flags, the zygote's {len(zygote.flags)}")
        return said

    def to_json(self) -> dict[str, object]:
        return {
            "orig_argv": list(self.orig_argv),
            "executable": self.executable,
            "options": list(self.options),
            "flags": list(self.flags),
            "warnoptions": list(self.warnoptions),
            "path": list(self.path),
        }

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> Startup:
        def strings(key: str) -> tuple[str, ...]:
            value = raw[key]
            if not isinstance(value, list):
                raise TypeError(f"startup.{key} is not a list")
            return tuple(str(x) for x in value)

        flags = raw["flags"]
        if not isinstance(flags, list):
            raise TypeError("startup.flags is not a list")
        return cls(
            orig_argv=strings("orig_argv"),
            executable=str(raw["executable"]),
            options=strings("options"),
            flags=tuple(int(x) for x in flags),
            warnoptions=strings("warnoptions"),
            path=strings("path"),
        )


@dataclass(frozen=True)
class Request:
    """What a rank would have been started with: its argv after the interpreter, cwd, env,
    its interpreter's startup; and who stands above it: the stub and the stub's parent, the
    torchrun agent."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    stub_pid: int
    agent_pid: int
    startup: Startup = field(default_factory=Startup)


def send_request(sock: socket.socket, request: Request, fds: tuple[int, ...] = (0, 1, 2)) -> None:
    body = json.dumps(
        {
            "argv": list(request.argv),
            "cwd": request.cwd,
            "env": request.env,
            "stub_pid": request.stub_pid,
            "agent_pid": request.agent_pid,
            "startup": request.startup.to_json(),
        }
    ).encode()
    socket.send_fds(sock, [b"R"], list(fds))
    sock.sendall(_LENGTH.pack(len(body)) + body)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 16))
        if not chunk:
            raise WireError(f"connection closed with {left} of {n} bytes unread")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_request(sock: socket.socket) -> tuple[Request, list[int]]:
    """The request and the descriptors that came with it (the caller owns and closes them)."""
    data, fds, _flags, _addr = socket.recv_fds(sock, 1, 3)
    if data != b"R" or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise WireError(f"bad request start {data!r} with {len(fds)} descriptor(s)")
    try:
        (length,) = _LENGTH.unpack(_read_exact(sock, _LENGTH.size))
        if length > MAX_REQUEST:
            raise WireError(f"request of {length} bytes")
        raw = json.loads(_read_exact(sock, length))
        request = Request(
            argv=tuple(str(a) for a in raw["argv"]),
            cwd=str(raw["cwd"]),
            env={str(k): str(v) for k, v in raw["env"].items()},
            stub_pid=int(raw["stub_pid"]),
            agent_pid=int(raw["agent_pid"]),
            startup=Startup.from_json(raw["startup"]),
        )
    except (WireError, ValueError, KeyError, TypeError, AttributeError) as exc:
        for fd in fds:
            os.close(fd)
        raise WireError(f"bad request: {exc}") from None
    return request, fds


def send_reply(sock: socket.socket, **reply: object) -> None:
    sock.sendall(json.dumps(reply).encode() + b"\n")


class Replies:
    """Reads the zygote's JSON lines; `next()` is None once the zygote closed the connection."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = b""

    def next(self) -> dict[str, object] | None:
        while b"\n" not in self._buf:
            chunk = self._sock.recv(4096)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        reply = json.loads(line)
        if not isinstance(reply, dict):
            raise WireError(f"bad reply {line!r}")
        return reply


_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_of(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a connected Unix socket, as the kernel
    recorded it (SO_PEERCRED): for a listening zygote, the process that listened."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, _gid = _PEERCRED.unpack(raw)
    return pid, uid


def not_the_zygote(peer: tuple[int, int], zygote_pid: int) -> str | None:
    """Why the listener at the socket path is not the zygote the launcher started (None: it
    is): a socket path can be bound first by anyone who may write its folder, and the stub
    hands the zygote the rank's environment and descriptors."""
    pid, uid = peer
    if uid != os.getuid():
        return f"it runs as uid {uid}, not as this rank's uid {os.getuid()}"
    if pid != zygote_pid:
        return f"it is pid {pid}, not the launcher's zygote (pid {zygote_pid})"
    return None


def refusal_path(socket_path: str) -> str:
    """Where a zygote that will not fork (a thread alive after its preload) writes why, before
    it exits: the stubs then start their rank's interpreter themselves."""
    return socket_path + ".refused"


def signal_rank(pid: int, pidfd: int, signum: int) -> None:
    """Send `signum` to the forked rank's process group: torchrun stops a cold rank with
    `killpg`, which reaches every helper process in the rank's group, and a forked rank leads
    its own group (the zygote gave it its own session). The pidfd is asked first, so the group
    is signalled only while the pid is still this rank's (alive or not yet reaped: never
    reused); a rank that moved to another group gets the signal alone. Raises OSError
    (ProcessLookupError) once the rank is reaped."""
    signal.pidfd_send_signal(pidfd, 0)
    try:
        leads = os.getpgid(pid) == pid
    except ProcessLookupError:
        leads = False
    if leads:
        os.killpg(pid, signum)
    else:
        signal.pidfd_send_signal(pidfd, signum)


_NOTE_PID = "pid "


@dataclass(frozen=True)
class Refusal:
    """A zygote's refusal note: the pid of the zygote that wrote it (None: a note without one)
    and why. A note left by an earlier zygote at the same path is not this zygote's word."""

    pid: int | None
    reason: str


def write_refusal(socket_path: str, reason: str) -> None:
    """This zygote's note (written whole, then renamed), its pid on the first line."""
    note = refusal_path(socket_path)
    with open(note + ".tmp", "w", encoding="utf-8") as out:
        out.write(f"{_NOTE_PID}{os.getpid()}\n{reason}\n")
    os.replace(note + ".tmp", note)


def read_refusal(socket_path: str) -> Refusal | None:
    """The note at this socket's refusal path, or None where there is none."""
    try:
        with open(refusal_path(socket_path), encoding="utf-8", errors="replace") as note:
            text = note.read()
    except FileNotFoundError:
        return None
    first, _, rest = text.partition("\n")
    pid: int | None = None
    if first.startswith(_NOTE_PID) and first[len(_NOTE_PID) :].strip().isdigit():
        pid, text = int(first[len(_NOTE_PID) :]), rest
    return Refusal(pid, text.strip() or "no reason given")


def clear_stale(socket_path: str) -> None:
    """Remove what an earlier zygote at this path may have left (its socket, its note, a half
    written note), so that none of it is taken for this zygote's. Best effort: a note that
    cannot be removed (another user's, in /tmp) names another pid, and no stub believes it."""
    note = refusal_path(socket_path)
    for path in (socket_path, note, note + ".tmp"):
        with contextlib.suppress(OSError):
            os.unlink(path)
