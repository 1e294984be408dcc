"""The scrub that outlives a killed launcher.

A launcher that is SIGKILLed (or killed by the kernel for memory) runs no ending: torchrun goes
down with it (`PR_SET_PDEATHSIG`), but what the ranks already wrote (their output in torchrun's
log files, their records, their error files) stays on disk with every secret a test printed.
So before it launches, the launcher starts this guardian in a session of its own and holds the
write end of a pipe to it. A launcher that finishes its ending writes `done`; a pipe that
closes without it means the launcher died, and the guardian then waits for the run's processes
to end (found by the rank plan in their environment) and scrubs the out folder as an ending
would have (the same secrets: the same environment, and the secrets typed on the launcher's
command line, which it sends first). No bundle is written: the folder says what ran, scrubbed.
It scrubs holding the folder's lock its launcher held, so on a multi-node run's shared folder
its scrub and another node writing the bundle in the dead launcher's place never interleave.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DONE = b"done\n"
# Guardians left scrubbing by launchers that raised: kept, so none is collected while it runs.
_ABANDONED: list[subprocess.Popen[bytes]] = []
WAIT_FOR_RUN_S = 60.0
# How long the guardian waits for the folder's lock (another node writing the bundle) before it
# scrubs regardless: a secret left on disk is worse than a bundle whose hashes it breaks.
WAIT_FOR_LOCK_S = 120.0


class Guardian:
    """The launcher's end of the guardian: `done()` once its ending is finished."""

    def __init__(self, proc: subprocess.Popen[bytes] | None, write_fd: int | None) -> None:
        self.proc = proc
        self.write_fd = write_fd

    @classmethod
    def start(cls, out_dir: Path, plan_entry: str | None, typed: list[str]) -> Guardian:
        """Start the guardian of `out_dir`; `plan_entry`: the environment entry that marks the
        run's processes; `typed`: secrets from the launcher's own command line."""
        read_fd, write_fd = os.pipe()
        root = str(Path(__file__).resolve().parents[2])  # the harness, wherever the cwd is
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        from harness.launch.proctree import start_launch_root

        try:  # a launch root: no launch's tracker in this process takes it for its orphan
            proc = start_launch_root(
                lambda: subprocess.Popen(
                    [sys.executable, "-m", "harness.launch.guardian", str(out_dir), str(read_fd)],
                    pass_fds=(read_fd,),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # a ^C at the terminal is the launcher's to handle
                    env={**os.environ, "PYTHONPATH": path},
                )
            )
        except OSError:
            os.close(write_fd)
            return cls(None, None)
        finally:
            os.close(read_fd)
        header = json.dumps({"plan": plan_entry, "typed": typed}).encode() + b"\n"
        with contextlib.suppress(OSError):
            os.write(write_fd, header)
        return cls(proc, write_fd)

    def abandon(self) -> None:
        """The launcher is leaving without an ending (an exception): the guardian scrubs now."""
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None
        if self.proc is not None:
            _ABANDONED.append(self.proc)
        self._forget()

    def _forget(self) -> None:
        from harness.launch.proctree import end_launch_root

        if self.proc is not None:
            end_launch_root(self.proc.pid)

    def done(self) -> None:
        """The ending is finished: the guardian exits without touching anything."""
        if self.write_fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self.write_fd, DONE)
        os.close(self.write_fd)
        self.write_fd = None
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        self._forget()


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def main(argv: list[str]) -> int:
    out_dir, fd = Path(argv[0]), int(argv[1])
    data = _read_all(fd)  # until the launcher closes it: done, or dead
    header, _, rest = data.partition(b"\n")
    if rest.endswith(DONE):
        return 0
    try:
        said = json.loads(header)
    except ValueError:
        said = {}
    from harness.core.secrets import environment_scrubber, register_secrets
    from harness.evidence.redact import scrub_folder
    from harness.launch.ending import EnvironmentWitness

    plan = said.get("plan")
    if isinstance(plan, str):
        witness = EnvironmentWitness(plan)
        deadline = time.monotonic() + WAIT_FOR_RUN_S
        while witness.find() and time.monotonic() < deadline:
            time.sleep(0.2)  # torchrun ends its ranks as the launcher's death reaches it
    typed = said.get("typed")
    if isinstance(typed, list):
        register_secrets([t for t in typed if isinstance(t, str)])
    with contextlib.suppress(Exception):
        _take(out_dir, WAIT_FOR_LOCK_S)
    with contextlib.suppress(Exception):
        scrub_folder(out_dir, environment_scrubber())
    return 0


def _take(out_dir: Path, wait_s: float) -> None:
    """The out folder's lock, held until this process exits, or nothing after `wait_s`."""
    from harness.evidence.writer import take_out_dir

    deadline = time.monotonic() + wait_s
    while not take_out_dir(out_dir) and time.monotonic() < deadline:
        time.sleep(0.2)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
