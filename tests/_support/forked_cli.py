"""`python -m harness ARGS` as its own process, forked from the pytest worker's forkserver
(`_support.forkserver`) instead of started cold, without an interpreter start and the command
line's imports per call (about 0.25 CPU-seconds each on two cores).

The child becomes the process `python -m harness ARGS` would be as a forked rank does
(`harness.rank.forkserved.become_cold`: multiprocessing's main process, a fresh `__main__`, its
own seeds, none of the worker's multiprocessing helpers), with its own exit code, stdout and
stderr, working directory and environment, and the interpreter's ending (threads joined, atexit
run, open files and streams flushed). As with `subprocess.run(capture_output=True)`, the run is
over only when no process holds its stdout or stderr any more: one the command leaked them to
keeps the caller waiting, to the timeout.

What differs from a cold `python -m harness`: torch is already imported (tests/test_torch_free.py
holds the cold command line torch-free, with real interpreters); the string-hash seed and what
else Python reads from the environment only at its start (PYTHONIOENCODING, ...) are the
server's; sys.path holds the pytest worker's entries behind the working directory and
PYTHONPATH; the child leads a session of its own."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from _support import forkserver
from harness.rank import forkserved, interpreter


def run(
    args: Sequence[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    memory_limit: int | None = None,
    module: str = "harness",
) -> subprocess.CompletedProcess[str]:
    """What `subprocess.run([python, "-m", module, *args], cwd=cwd, env=env,
    capture_output=True, text=True, timeout=timeout)` returns; raises subprocess.TimeoutExpired,
    the child killed, as it does. `memory_limit`: bytes of address space the command may take
    beyond what the child holds when it starts (RLIMIT_AS; the server's torch is most of that)."""
    argv = [sys.executable, "-m", module, *args]
    with tempfile.TemporaryDirectory(prefix="forked-cli-") as streams:
        out, err = Path(streams) / "stdout", Path(streams) / "stderr"
        out.touch()
        err.touch()  # read as empty where the child died before it wrote a byte
        environ = dict(os.environ if env is None else env)
        child = forkserver.context().Process(
            target=_command,
            args=(module, tuple(args), str(cwd), environ, str(out), str(err), memory_limit),
        )
        deadline = time.monotonic() + timeout
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(argv, timeout)
        while _held({str(out), str(err)}):  # by what the command left running
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(argv, timeout)
            time.sleep(0.05)
        return subprocess.CompletedProcess(argv, child.exitcode, out.read_text(), err.read_text())


def cold(
    args: Sequence[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    module: str = "harness",
) -> subprocess.CompletedProcess[str]:
    """The same command from a real interpreter, as a user starts it: what `run` is held to."""
    argv = [sys.executable, "-m", module, *args]
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _held(paths: set[str]) -> bool:
    """Whether any process has one of `paths` open."""
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if any(opened.path in paths for opened in process.open_files()):
                return True
    return False


def _command(
    module: str,
    args: tuple[str, ...],
    cwd: str,
    env: dict[str, str],
    out: str,
    err: str,
    memory_limit: int | None,
) -> None:
    """The child: its streams to the two files, then `-m module` as the interpreter runs it and
    ends it, as a forked rank does (`harness.rank.forkserved.run`), never as multiprocessing
    ends its children."""
    for fd, path in ((1, out), (2, err)):
        opened = os.open(path, os.O_WRONLY)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    module, module_args = forkserved.become_cold(["-m", module, *args])
    # As `-m` starts: the working directory first (`become_cold`), then PYTHONPATH's entries.
    sys.path[1:1] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if memory_limit is not None:
        held = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (held + memory_limit, held + memory_limit))
    code = interpreter.run_module(module, module_args)
    interpreter.wind_down()
    interpreter.leave(code)
