"""The rank's output scrubbed as it is written, loaded first on every rank (`-p
harness.rank.outrelay`, before the heap and the rank plugin).

Why: torchrun gives each rank its log files as stdout and stderr, and the launcher scrubs them
only at the run's ending. A launcher killed by SIGKILL or the OOM killer runs no ending; its
guardian scrubs the folder afterwards, unless it was killed too (a whole session or container
killed at once). So as this plugin registers, the rank forks a relay: the rank's descriptors 1
and 2 become pipes to it, and it writes what arrives to the log files, scrubbed
(`harness.core.livescrub`): a secret a test prints never reaches the disk. Everything the rank
and the processes it starts write to 1 and 2 passes through it (Python's streams, C code, a
subprocess's inherited output).

The relay is a forked copy of the rank at its start (no interpreter to start, the scrubber
already built): it keeps only the pipes and the log files open, ignores the signals torchrun and a
terminal send to the rank's process group, and writes until every writer of the pipes is gone;
then it exits. So a rank's last lines (a traceback, an `os._exit`) are written after it died,
within milliseconds; where nothing else outlived torchrun, the launcher lets the relays its
ranks' records name (`RankStart.output_relay`) finish before it looks again for what did
(`harness.launch.ending`). Its process name says what it is (`RELAY_NAME`). A SIGKILL of the
whole group loses what the relay held (at most an unfinished line), never leaks it.

Not covered: files a test writes itself (the ending, or the guardian, scrubs those), and text a
test writes into torchrun's log files by their path.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
from typing import TYPE_CHECKING

from harness.core.livescrub import LiveScrub
from harness.core.secrets import Scrubber, environment_scrubber, register_secrets

if TYPE_CHECKING:  # the launcher imports the names below without pytest
    import pytest

# The relay's process name (its /proc comm), which the launcher knows it by.
RELAY_NAME = "dcpqual-relay"
# Set by the launcher for its ranks (the relay starts only where it is set, so a pytest session
# that loads the rank's plugins in-process keeps its own descriptors): the secrets typed on the
# launcher's own command line, as a JSON list, which the relay scrubs as the launcher's ending
# would. Its name is secret-looking: the variable is redacted wherever an environment is kept.
OUTPUT_SECRETS_ENV = "DCPQUAL_OUTPUT_SECRETS"
# What a terminal or torchrun sends the rank's process group: the relay outlives the rank to
# write its last lines.
_IGNORED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_READ = 1 << 16
_DROPPED = "scrubbing this stream failed; its output is dropped from here on"
_started: list[int] = []  # the relay this process started


def relay_pid() -> int | None:
    """The pid of the relay this rank started (None: none)."""
    return _started[-1] if _started else None


def rank_scrubber(environ: dict[str, str] | os._Environ[str] | None = None) -> Scrubber:
    """What the launcher's ending would scrub: the secrets of this environment and those the
    launcher was typed (`OUTPUT_SECRETS_ENV`)."""
    env = os.environ if environ is None else environ
    try:
        typed = json.loads(env.get(OUTPUT_SECRETS_ENV, "[]"))
    except ValueError:
        typed = []
    register_secrets([v for v in typed if isinstance(v, str)] if isinstance(typed, list) else [])
    return environment_scrubber()


def relay(sources: dict[int, int], scrubber: Scrubber) -> None:
    """Copy each pipe of `sources` (pipe -> the descriptor it is written to) to its target,
    scrubbed, until every pipe reached its end. A scrub that fails (a bug) says so in one line
    and drops that stream's output from then on: never a raw byte, and the rank never blocks."""
    live = {fd: LiveScrub(scrubber) for fd in sources}
    broken: set[int] = set()
    poller = select.poll()  # not select(): a rank may hold more than 1024 descriptors
    for fd in live:
        poller.register(fd, select.POLLIN)
    while live:
        for fd, _ in poller.poll():
            try:
                piece = os.read(fd, _READ)
            except OSError:
                piece = b""
            if fd not in broken:
                try:
                    _write_all(sources[fd], live[fd].feed(piece) if piece else live[fd].end())
                except Exception as exc:  # a failing scrub must not leak nor stop the rank
                    broken.add(fd)
                    _write_all(sources[fd], f"\n[{RELAY_NAME}: {_DROPPED}: {exc!r}]\n".encode())
            if not piece:
                poller.unregister(fd)
                os.close(fd)
                del live[fd]


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data`; a write that fails (a full disk) drops the rest: the rank must not
    block on output that cannot be kept."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except OSError:
            return


def _become_relay(keep: set[int]) -> None:
    """In the forked child: named, deaf to the group's signals, holding only `keep` and 0-2."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(RELAY_NAME)
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def start(scrubber: Scrubber) -> int:
    """Fork the relay and make descriptors 1 and 2 pipes to it; returns its pid."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    pipes = {target: os.pipe() for target in (1, 2)}
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the relay; tests watch what it writes
        code = 0
        try:
            _become_relay({read for read, _ in pipes.values()})
            relay({read: target for target, (read, _) in pipes.items()}, scrubber)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    for target, (read, write) in pipes.items():
        os.close(read)
        os.dup2(write, target)
        os.close(write)
    _started.append(pid)
    return pid


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Called as this plugin registers, before pytest or any other plugin writes a line."""
    if OUTPUT_SECRETS_ENV in os.environ:
        start(rank_scrubber())
