"""The processes above this rank, under either launch: its torchrun agent and, where the rank was
forked from the zygote (`harness.rank.zygote`), the fork stub torchrun started for it and the
zygote itself.

Whatever on the rank side means "my torchrun agent" asks `agent_pid()`: `os.getppid()` is the
agent only where torchrun started the rank's interpreter itself; a forked rank's parent is the
zygote. The zygote sets a forked rank's `Parentage` in the child right after the fork, as a value
in this process, not in the environment its own subprocesses inherit.

Standard library only: the zygote imports it before torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Parentage:
    """`agent`: the torchrun agent that started this rank. `stub` and `zygote`: where the rank
    was forked, the stub that stands for it towards torchrun and the zygote that forked it
    (its parent); None where torchrun started the rank itself."""

    agent: int
    stub: int | None = None
    zygote: int | None = None

    @property
    def forked(self) -> bool:
        return self.zygote is not None

    def between(self) -> dict[int, str]:
        """{pid: what it is} for the launch's processes between this rank and its agent: a
        signal to one of them ends the job as one to the agent would."""
        named: dict[int, str] = {}
        if self.stub is not None:
            named[self.stub] = "its fork stub (the process torchrun started for it)"
        if self.zygote is not None:
            named[self.zygote] = "the rank zygote that forked it"
        return named


_forked: Parentage | None = None


def set_forked(parentage: Parentage) -> None:
    """In a rank the zygote just forked: who its agent and stub are."""
    global _forked
    _forked = parentage


def parentage() -> Parentage:
    """This rank's parentage; where it was not forked, its parent is its agent."""
    return _forked if _forked is not None else Parentage(agent=os.getppid())


def agent_pid() -> int:
    """The torchrun agent that started this rank, under either launch."""
    return parentage().agent
