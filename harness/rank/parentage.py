"""The processes above this rank, under either launch: its torchrun agent and, where the agent
started it as a function (`harness.launch.agent`), the forkserver that forked it.

Whatever on the rank side means "my torchrun agent" asks `agent_pid()`: `os.getppid()` is the
agent only where torchrun started the rank's interpreter itself; a forked rank's parent is the
forkserver. Whoever forked the rank sets its `Parentage` in the child, as a value in this
process, not in the environment its own subprocesses inherit.

Standard library only: the forkserver imports it before its ranks exist.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Parentage:
    """`agent`: the torchrun agent that started this rank. `forkserver`: where the agent started
    it as a function, the forkserver that forked it (its parent); None where torchrun started
    the rank's interpreter itself."""

    agent: int
    forkserver: int | None = None

    @property
    def forked(self) -> bool:
        """Forked from a preloaded interpreter (whose string-hash seed it shares)."""
        return self.forkserver is not None

    def between(self) -> dict[int, str]:
        """{pid: what it is} for the launch's processes between this rank and its agent: a
        signal to one of them ends the job as one to the agent would."""
        if self.forkserver is None:
            return {}
        return {self.forkserver: "the forkserver that forked it (its agent's)"}


_forked: Parentage | None = None


def set_forked(parentage: Parentage) -> None:
    """In a rank a forkserver just forked: who its agent is, and what is between."""
    global _forked
    _forked = parentage


def parentage() -> Parentage:
    """This rank's parentage; where it was not forked, its parent is its agent."""
    return _forked if _forked is not None else Parentage(agent=os.getppid())


def agent_pid() -> int:
    """The torchrun agent that started this rank, under either launch."""
    return parentage().agent
