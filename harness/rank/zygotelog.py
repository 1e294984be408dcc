"""The zygote's log lines, written by the zygote (`harness.rank.zygote`) and read back by the
launcher (`harness.launch.zygote`): one typed value per line and one format/parse pair, so the
two sides cannot drift apart.

The launcher counts forks from these lines, and a `Reaped` line is its proof that a rank too
short-lived for its process scans has exited.

Standard library only: the zygote imports it before torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "dcpqual zygote:"


@dataclass(frozen=True)
class Ready:
    """The preload is done and the socket listens."""

    pid: int
    seconds: float
    modules: tuple[str, ...]


@dataclass(frozen=True)
class Forked:
    """One rank forked; `rank`: its RANK variable (None where it has none)."""

    pid: int
    stub: int
    rank: int | None


@dataclass(frozen=True)
class Reaped:
    """One forked rank reaped, with its raw wait status."""

    pid: int
    status: int


@dataclass(frozen=True)
class SentCold:
    """A stub asked for a rank this zygote cannot fork faithfully: it starts the rank cold."""

    stub: int
    reason: str


@dataclass(frozen=True)
class Refused:
    """The zygote forks nothing (why); it exits after this line."""

    reason: str


@dataclass(frozen=True)
class NotPreloaded:
    """A module the preload could not import (why): each rank imports it itself, as cold."""

    module: str
    error: str


Event = Ready | Forked | Reaped | SentCold | Refused | NotPreloaded

_READY = re.compile(r"ready pid (\d+), \d+ modules preloaded in ([0-9.]+)s: ?(.*)")
_FORKED = re.compile(r"forked pid (\d+) for stub (\d+) rank (\S+)")
_REAPED = re.compile(r"reaped pid (\d+) status (-?\d+)")
_COLD = re.compile(r"sent cold stub (\d+): (.*)")
_REFUSED = re.compile(r"not forking: (.*)")
_NOT_PRELOADED = re.compile(r"not preloaded: (\S+): (.*)")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def format_event(event: Event) -> str:
    """The line (without its newline) the zygote prints for `event`."""
    if isinstance(event, Ready):
        body = (
            f"ready pid {event.pid}, {len(event.modules)} modules preloaded in "
            f"{event.seconds:.1f}s: {', '.join(event.modules)}"
        )
    elif isinstance(event, Forked):
        rank = "?" if event.rank is None else str(event.rank)
        body = f"forked pid {event.pid} for stub {event.stub} rank {rank}"
    elif isinstance(event, Reaped):
        body = f"reaped pid {event.pid} status {event.status}"
    elif isinstance(event, SentCold):
        body = f"sent cold stub {event.stub}: {_one_line(event.reason)}"
    elif isinstance(event, NotPreloaded):
        body = f"not preloaded: {event.module}: {_one_line(event.error)}"
    else:
        body = f"not forking: {_one_line(event.reason)}"
    return f"{PREFIX} {body}"


def parse_event(line: str | bytes) -> Event | None:
    """The event on one log line; None for any other line (a warning, a traceback)."""
    if isinstance(line, bytes):
        line = line.decode(errors="replace")
    line = line.rstrip("\r\n")
    if not line.startswith(PREFIX + " "):
        return None
    body = line[len(PREFIX) + 1 :]
    if m := _READY.fullmatch(body):
        modules = tuple(x for x in m[3].split(", ") if x)
        return Ready(int(m[1]), float(m[2]), modules)
    if m := _FORKED.fullmatch(body):
        return Forked(int(m[1]), int(m[2]), int(m[3]) if m[3].isdigit() else None)
    if m := _REAPED.fullmatch(body):
        return Reaped(int(m[1]), int(m[2]))
    if m := _COLD.fullmatch(body):
        return SentCold(int(m[1]), m[2])
    if m := _REFUSED.fullmatch(body):
        return Refused(m[1])
    if m := _NOT_PRELOADED.fullmatch(body):
        return NotPreloaded(m[1], m[2])
    return None


def read_events(data: bytes) -> list[Event]:
    """Every event in a log's bytes, in order."""
    return [e for line in data.splitlines() if (e := parse_event(line)) is not None]
