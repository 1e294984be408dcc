"""A rank started by torchelastic's agent as a function, in a child of multiprocessing's
forkserver (`harness.launch.agent`): it becomes the process `python -u -m MODULE ARGS` would be,
then runs the module.

Why: the forkserver imported torch, pytest and the harness once, so sixteen ranks start in the
time of one import instead of sixteen imports at once on a few cores. What a forkserver child
is not yet, and a cold interpreter is, is set here: its own session (torchrun starts each rank
in one), `sys.argv`, `sys.orig_argv` and `sys.path[0]` as `-m` sets them, a fresh `__main__`,
the default signal dispositions, the main process of its own multiprocessing world (its own
authkey, no parent), torch's thread count from its own environment (torch read the variable
when the forkserver imported it), and its own draws of Python's, NumPy's and torch's generators.
What it cannot get is its own string-hash seed: the forkserver's, which the plan fixes for every
rank of the node, is the one it has.

The module's exit is the rank's: 0 returns to the agent (which reads the return as success), any
other code exits with it, and an uncaught KeyboardInterrupt ends the rank by SIGINT as it ends an
interpreter.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import types
from collections.abc import Sequence
from typing import Any

from harness.core import preloaded as handover
from harness.rank import interpreter, parentage
from harness.rank.preload import FORKSERVER_PRELOAD_MODULE, HEAP_PLUGIN

# The flags `python` itself takes before `-m` that a rank's command may carry (torchrun's `-u`).
INTERPRETER_FLAGS: frozenset[str] = frozenset({"-u"})


class CommandError(ValueError):
    """A rank command this function cannot run (only `[-u] -m MODULE ARGS`)."""


def module_command(argv: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """(module, its arguments) of `[-u] -m MODULE ARGS`, as torchrun hands a `-m` rank."""
    rest = list(argv)
    while rest and rest[0] in INTERPRETER_FLAGS:
        rest.pop(0)
    if len(rest) < 2 or rest[0] != "-m":
        raise CommandError(f"a forkserver rank runs `[-u] -m MODULE ARGS`, got {list(argv)!r}")
    return rest[1], tuple(rest[2:])


def become_cold(argv: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """Make this forkserver child the interpreter `python ARGV` would have started; returns the
    module to run and its arguments."""
    module, args = module_command(argv)
    os.setsid()  # as torchrun starts each rank: its own session
    _no_parent_death_signal()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    sys.orig_argv = [sys.executable, *argv]  # sys.argv: `interpreter.run_module`'s, as `-m` sets it
    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
    fresh = types.ModuleType("__main__")  # the interpreter's own, not the forkserver's
    fresh.__dict__["__builtins__"] = sys.modules["builtins"]
    sys.modules["__main__"] = fresh
    _own_multiprocessing_world()
    _own_stdin()
    _without_the_agents_helpers()
    interpreter.draw_own_seeds(os.environ)
    return module, args


def _no_parent_death_signal() -> None:
    """torch's process start asks the kernel for SIGINT when the forkserver dies
    (`PR_SET_PDEATHSIG`); a cold rank has no such signal, and learns its agent is gone from its
    watchdog, as this one does (`harness.rank.watchdog`)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, 0)  # PR_SET_PDEATHSIG, none


def _own_multiprocessing_world() -> None:
    """A cold interpreter is multiprocessing's main process: named so, no identity, no parent
    (its authkey is drawn with the other seeds). The forkserver made this one its child."""
    import itertools
    from multiprocessing import context, process

    me = process.current_process()
    me._name, me._identity = "MainProcess", ()  # type: ignore[attr-defined]
    me._parent_pid = me._parent_name = None  # type: ignore[attr-defined]
    process._parent_process = None  # type: ignore[attr-defined]
    process._process_counter = itertools.count(1)  # type: ignore[attr-defined]
    # No start method chosen yet (a child's bootstrap forces its own, "forkserver", which would
    # be the rank's default and refuse its `set_start_method`), and no temporary folder (the
    # agent's, which it removes as it ends).
    context._default_context._actual_context = None  # type: ignore[attr-defined]
    me._config.pop("tempdir", None)  # type: ignore[attr-defined]


def _own_stdin() -> None:
    """A cold interpreter's stdin is fd 0, which the agent handed down (torchrun's ranks inherit
    it), opened as the interpreter opens it. multiprocessing closed `sys.stdin` in the
    forkserver and again in this child, leaving `sys.__stdin__` closed and a wrapper of its own
    over a /dev/null it opened in its place (closed here)."""
    replaced = sys.stdin
    stream: io.TextIOWrapper | None = None  # fd 0 closed: None, as the interpreter has it
    with contextlib.suppress(OSError):
        os.fstat(0)
        like = sys.__stdout__
        buffered = open(0, "rb", closefd=False)  # noqa: SIM115  # the interpreter's, kept open
        buffered.raw.name = "<stdin>"  # type: ignore[attr-defined]
        stream = io.TextIOWrapper(
            buffered,
            encoding=None if like is None else like.encoding,
            errors=None if like is None else like.errors,
            newline="\n",  # the interpreter's, on POSIX: no translation
            line_buffering=buffered.isatty(),
        )
        stream.mode = "r"  # type: ignore[misc]
    for name in ("stdin", "__stdin__"):  # `__stdin__` is final to type checkers, not to Python
        setattr(sys, name, stream)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fd = replaced.fileno()
        if fd > 2 and os.readlink(f"/proc/self/fd/{fd}") == os.devnull:
            os.close(fd)


def _without_the_agents_helpers() -> None:
    """A cold interpreter has no forkserver or resource tracker yet; a forkserver child holds
    its agent's (multiprocessing hands each child the server's liveness pipe and the tracker's
    pipe). Kept, everything the rank starts would hold them too, and the agent, which waits for
    both to end as it ends, would wait as long as a daemon or output relay of the rank lives.
    Closed, the rank starts its own where it uses them, as a cold one does."""
    from multiprocessing import forkserver, resource_tracker

    # CPython's own singletons; their private fields are what `_stop` and `ensure_running` read.
    server: Any = forkserver._forkserver
    tracker: Any = resource_tracker._resource_tracker
    for fd in (server._forkserver_alive_fd, tracker._fd):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    server._forkserver_alive_fd = server._forkserver_address = server._forkserver_pid = None
    tracker._fd = tracker._pid = None


def run(agent: str, *argv: str) -> None:
    """torchelastic's entrypoint for each rank of the agent `agent` (its pid): `python ARGV` in
    this process. Returns where the interpreter would exit 0 (the agent reads the return as the
    rank's success); otherwise exits with the interpreter's code, or dies of SIGINT."""
    parentage.set_forked(parentage.Parentage(agent=int(agent), forkserver=os.getppid()))
    module, args = become_cold(argv)
    server = sys.modules.get(FORKSERVER_PRELOAD_MODULE)
    preloaded = getattr(server, "PRELOADED", None)
    if preloaded is not None:
        handover.hand_over(preloaded.warned, preloaded.modules)
    if HEAP_PLUGIN not in argv:  # nothing else re-issues them: before the module runs
        handover.reissue(handover.STARTUP)
    code = interpreter.run_module(module, args)
    interpreter.wind_down()
    if code != 0:
        interpreter.leave(code)
