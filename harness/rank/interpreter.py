"""What a rank started from a preloaded process (forked by multiprocessing's forkserver) does
where a cold interpreter would: run `-m MODULE` as `__main__`, draw its own generators, and end
as the interpreter ends (threads joined, atexit run, files flushed, the exit code or death by
SIGINT)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import NoReturn

from harness.rank import openfiles

# What `run_module` returns for an uncaught KeyboardInterrupt: the interpreter then ends by
# SIGINT (after its atexit), so its parent sees a death by SIGINT, not an exit code.
INTERRUPTED = -signal.SIGINT


# The exit codes a C long holds: the interpreter exits -1 (255) for an int beyond them.
_LONG_BITS = 8 * ctypes.sizeof(ctypes.c_long)


def exit_code(exc: SystemExit) -> int:
    """What the interpreter exits with for this SystemExit (printing a non-int code)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        if not -(1 << (_LONG_BITS - 1)) <= code < 1 << (_LONG_BITS - 1):
            return 0xFF
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def run_module(module: str, args: Sequence[str]) -> int:
    """`python -m MODULE ARGS` in this process; returns the exit code the interpreter would
    (INTERRUPTED: it would die of SIGINT)."""
    import runpy

    sys.argv = [module, *args]  # runpy sets argv[0] to the module's file
    try:
        # What `-m` runs: the module in the __main__ namespace, argv[0] its file.
        runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]
    except SystemExit as exc:
        return exit_code(exc)
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            sys.excepthook(type(exc), exc, exc.__traceback__)
        return INTERRUPTED if isinstance(exc, KeyboardInterrupt) else 1
    return 0


def draw_own_seeds(env: Mapping[str, str]) -> None:
    """Draw what each interpreter draws once at its start (the random modules, torch's
    generator, multiprocessing's authkey), and take torch's thread count from `env` (torch read
    OMP_NUM_THREADS when the preloading process imported it)."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
        threads = env.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))
    process = sys.modules.get("multiprocessing.process")
    if process is not None:
        process.current_process().authkey = os.urandom(32)


def wind_down() -> None:
    """The interpreter's own exit work, short of exiting: join non-daemon threads, run atexit,
    flush the files still open and the standard streams."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        import atexit

        atexit._run_exitfuncs()
    with contextlib.suppress(BaseException):
        openfiles.flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def leave(code: int) -> NoReturn:
    """Exit with `code` without unwinding into the preloading process's code, or die of SIGINT
    for INTERRUPTED."""
    if code == INTERRUPTED:
        with contextlib.suppress(BaseException):
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(128 + signal.SIGINT)
    os._exit(code)
