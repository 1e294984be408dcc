"""The processes above this rank, under any launch: its torchrun agent and, where the rank was
forked from the zygote (`harness.rank.zygote`), the fork stub torchrun started for it and the
zygote itself, or, where torchelastic's agent started it as a function
(`harness.launch.agent`), the forkserver that forked it.

Whatever on the rank side means "my torchrun agent" asks `agent_pid()`: `os.getppid()` is the
agent only where torchrun started the rank's interpreter itself; a forked rank's parent is the
zygote or the forkserver. Whoever forked the rank sets its `Parentage` in the child, as a value
in this process, not in the environment its own subprocesses inherit.

Standard library only: the zygote imports it before torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Parentage:
    """`agent`: the torchrun agent that started this rank. `stub` and `zygote`: where the rank
    was forked from the zygote, the stub that stands for it towards torchrun and the zygote
    (its parent). `forkserver`: where the agent started it as a function, the forkserver that
    forked it (its parent). None where torchrun started the rank's interpreter itself."""

    agent: int
    stub: int | None = None
    zygote: int | None = None
    forkserver: int | None = None

    @property
    def forked(self) -> bool:
        """Forked from the zygote (what the evidence counts as a zygote's rank)."""
        return self.zygote is not None

    def between(self) -> dict[int, str]:
        """{pid: what it is} for the launch's processes between this rank and its agent: a
        signal to one of them ends the job as one to the agent would."""
        named: dict[int, str] = {}
        if self.stub is not None:
            named[self.stub] = "its fork stub (the process torchrun started for it)"
        if self.zygote is not None:
            named[self.zygote] = "the rank zygote that forked it"
        if self.forkserver is not None:
            named[self.forkserver] = "the forkserver that forked it (its agent's)"
        return named


_forked: Parentage | None = None


def set_forked(parentage: Parentage) -> None:
    """In a rank the zygote or a forkserver just forked: who its agent is, and what is between."""
    global _forked
    _forked = parentage


def parentage() -> Parentage:
    """This rank's parentage; where it was not forked, its parent is its agent."""
    return _forked if _forked is not None else Parentage(agent=os.getppid())


def agent_pid() -> int:
    """The torchrun agent that started this rank, under either launch."""
    return parentage().agent
