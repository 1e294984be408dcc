"""`python -m harness ARGS` as its own process, forked from the pytest worker's forkserver
(`_support.forkserver`) instead of started cold: the same boundary a user's command has (its exit
code, its own stdout and stderr, working directory and environment, atexit run and streams
flushed at its end), without an interpreter start and the command line's imports per call
(about 0.25 CPU-seconds each on two cores).

What differs from a cold `python -m harness`: torch is already imported (tests/test_torch_free.py
holds the cold command line torch-free, with real interpreters); the string-hash seed and what
else Python reads from the environment only at its start (PYTHONIOENCODING, ...) are the
server's; sys.path is the pytest worker's behind the working directory and PYTHONPATH; stdin is
/dev/null."""

from __future__ import annotations

import atexit
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from _support import forkserver
from harness.rank import interpreter


def run(
    args: Sequence[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    memory_limit: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """What `subprocess.run([python, "-m", "harness", *args], cwd=cwd, env=env,
    capture_output=True, text=True, timeout=timeout)` returns; raises subprocess.TimeoutExpired,
    the child killed, as it does. `memory_limit`: bytes of address space the command may take
    beyond what the child holds when it starts (RLIMIT_AS; the server's torch is most of that)."""
    argv = [sys.executable, "-m", "harness", *args]
    with tempfile.TemporaryDirectory(prefix="forked-cli-") as streams:
        out, err = Path(streams) / "stdout", Path(streams) / "stderr"
        out.touch()
        err.touch()  # read as empty where the child died before it wrote a byte
        environ = dict(os.environ if env is None else env)
        child = forkserver.context().Process(
            target=_command,
            args=(tuple(args), str(cwd), environ, str(out), str(err), memory_limit),
        )
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(argv, timeout)
        return subprocess.CompletedProcess(argv, child.exitcode, out.read_text(), err.read_text())


def _command(
    args: tuple[str, ...],
    cwd: str,
    env: dict[str, str],
    out: str,
    err: str,
    memory_limit: int | None,
) -> None:
    """The child: its streams to the two files, then `-m harness` as the interpreter runs it,
    and the interpreter's ending (threads joined, atexit run, streams flushed), never
    multiprocessing's."""
    for fd, path in ((1, out), (2, err)):
        opened = os.open(path, os.O_WRONLY)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # As `-m` starts: the working directory first, then PYTHONPATH's entries.
    pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [os.getcwd(), *pythonpath]
    if memory_limit is not None:
        held = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (held + memory_limit, held + memory_limit))
    code = interpreter.run_module("harness", args)
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    interpreter.leave(code)
