"""multiprocessing's forkserver, started as a fork of this process instead of a fresh interpreter.

multiprocessing starts its forkserver by exec'ing `python -c "from multiprocessing.forkserver
import main; main(...)"` with the listening socket and the liveness pipe passed down
(`multiprocessing.util.spawnv_passfds`); that fresh interpreter then imports the preload list.
The agent imports the very same list itself (it needs torch for torchelastic anyway), so a
second import of torch, pytest and the harness (and vLLM for real trees) in the server is one
node's ranks' whole start-up cost paid twice. Forked from the agent after its preload, the server
holds those imports already and runs the command multiprocessing would have exec'd, unchanged:
its own `main`, socket, protocol and children, as the fresh one would.

What the fork must not carry into the server, it drops as exec would: every fd but stdin,
stdout, stderr and the ones multiprocessing passes; the agent's `__main__`, `argv` and
`path[0]` (`-c`'s instead); and the lock multiprocessing's `ensure_running` holds while it starts
the server, which a rank that starts a forkserver of its own would otherwise wait on forever.
Forked only from one thread (a fork copies no other thread, and their locks stay held): the
caller checks, and starts the fresh interpreter where more are alive.

Only the server is forked (multiprocessing's resource tracker, started the same way, stays a fresh
interpreter: it imports nothing). Where a later CPython starts its server without
`spawnv_passfds`, or with another command, the server is exec'd as before: slower, never wrong.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
import types
from collections.abc import Iterator, Sequence
from multiprocessing import forkserver, util
from typing import Any

from harness.rank import interpreter

# How multiprocessing's command for its forkserver starts (`ForkServer.ensure_running`).
SERVER_COMMAND = "from multiprocessing.forkserver import main"
# How many fds a process may have, where the kernel does not say.
_FD_LIMIT_FALLBACK = 1 << 16


@contextlib.contextmanager
def forked_from_here() -> Iterator[list[int]]:
    """While open, multiprocessing starts its forkserver (`forkserver.ensure_running`) as a fork
    of this process. Yields the pids of the servers it forked (empty: multiprocessing started
    none, or not the way this replaces)."""
    forked: list[int] = []
    exec_instead = util.spawnv_passfds

    def fork_instead(path: Any, args: Sequence[Any], passfds: Sequence[int]) -> int:
        if not is_forkserver_start(args):  # the resource tracker, or a start this does not know
            return int(exec_instead(path, args, passfds))
        pid = fork_running(args[-1], passfds)
        forked.append(pid)
        return pid

    util.spawnv_passfds = fork_instead
    try:
        yield forked
    finally:
        util.spawnv_passfds = exec_instead


def is_forkserver_start(args: Sequence[Any]) -> bool:
    """Whether `args` is the command multiprocessing starts its forkserver with."""
    return (
        len(args) >= 2
        and args[-2] == "-c"
        and isinstance(args[-1], str)
        and args[-1].startswith(SERVER_COMMAND)
    )


def fork_running(command: str, passfds: Sequence[int]) -> int:
    """Fork a child that runs `command` as `python -c COMMAND` would, with only `passfds` (and
    fds 0-2) open; returns its pid. The child exits with the command's exit code."""
    _flush_std_streams()  # what they buffer is this process's to write, not the child's too
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = _run_as_dash_c(command, passfds)
    finally:
        os._exit(code)


def _run_as_dash_c(command: str, passfds: Sequence[int]) -> int:
    """In the forked child: the interpreter `python -c COMMAND` would be, as far as the server
    reads it, then the command; its exit code, as the interpreter would exit with it."""
    code = 0
    try:
        close_fds_except({0, 1, 2, *map(int, passfds)})
        # Held by the parent's `ensure_running` while it forked this child; the server's own
        # children (the ranks) would inherit it held.
        forkserver._forkserver._lock = threading.Lock()  # type: ignore[attr-defined]
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = sys.modules["builtins"]
        sys.modules["__main__"] = main
        sys.argv = ["-c"]
        if sys.path:
            sys.path[0] = ""  # `-c` puts the empty string (the working directory) first
        exec(compile(command, "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        code = interpreter.exit_code(exc)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        _flush_std_streams()
    return code


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()


def close_fds_except(keep: set[int]) -> None:
    """Close every fd of this process but `keep`, as exec with `close_fds` would leave it."""
    try:
        limit = os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        limit = _FD_LIMIT_FALLBACK
    if limit <= 0:
        limit = _FD_LIMIT_FALLBACK
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = max(low, fd + 1)
    os.closerange(low, max(low, limit))
