"""Notice a rank's own action that breaks the world for every rank, as it happens.

Two actions are seen:
- the rank destroyed its default process group (`torch.distributed.destroy_process_group`):
  checked after each test, before the ranks agree on it, so the test fails on that rank and the
  agreement makes it primary even when a peer's collective failed first;
- the rank sent a signal to its torchrun agent (`harness.rank.parentage`: its parent at
  start-up, unless the agent's forkserver forked it) or the agent's process group, or, where it
  was forked, to the forkserver or, where it leads one, its process group, which end the job as
  surely: a `sys.addaudithook` hook sees `os.kill`/`os.killpg` before the
  signal is sent, so the record says so even when the signal kills the agent and every rank is
  then an orphan.

Not seen: a signal sent from a subprocess (a `kill` command), from C code, or through
`signal.pidfd_send_signal` (no audit event); `signal.pthread_kill` only reaches this process's
own threads, so it cannot reach the agent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping

import torch.distributed as dist

from harness.schema.rank_record import WorldBreak

_EVENTS = frozenset({"os.kill", "os.killpg"})


def group_alive() -> bool:
    return dist.is_initialized()


def destroyed_group(rank: int, test: str, *, alive_before: bool) -> WorldBreak | None:
    """A WorldBreak when the default process group was there when the test began and is gone
    now (the plugin joins it before collection and leaves it only after the session)."""
    if not alive_before or dist.is_initialized():
        return None
    return WorldBreak(
        action="destroyed-process-group",
        test=test,
        at=time.time(),
        message=(
            f"rank {rank} destroyed its default process group during {test} "
            "(torch.distributed is no longer initialized after it): every rank's collectives "
            "with it fail"
        ),
    )


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class AgentWatch:
    """The audit hook: calls `on_break` once, with the signal aimed at the agent, before it is
    sent. Audit hooks cannot be removed, so `close` only disarms it."""

    def __init__(
        self,
        rank: int,
        agent_pid: int,
        current_test: Callable[[], str | None],
        on_break: Callable[[WorldBreak], None],
        between: Mapping[int, str] | None = None,
    ) -> None:
        """`between`: {pid: what it is} for the processes between this rank and its agent (its
        forkserver), a signal to which counts as one to the agent."""
        self.rank = rank
        self.agent_pid = agent_pid
        self.between = dict(between or {})
        try:
            self.agent_pgid: int | None = os.getpgid(agent_pid)
        except OSError:
            self.agent_pgid = None
        # {pgid: what leads it} for the groups of the processes between: where one leads its
        # own, `os.killpg(os.getpgid(os.getppid()))` in a forked rank signals it, as it
        # signals the agent's group in a cold one.
        self.between_groups: dict[int, str] = {}
        for pid, what in self.between.items():
            with contextlib.suppress(OSError):
                self.between_groups.setdefault(os.getpgid(pid), what)
        self.current_test = current_test
        self.on_break = on_break
        self._armed = True
        self._inside = threading.local()
        # Held here: the hook outlives the module's globals, which are None by interpreter exit.
        self._events = _EVENTS

    def install(self) -> AgentWatch:
        sys.addaudithook(self._hook)
        return self

    def close(self) -> None:
        self._armed = False

    @staticmethod
    def _group_of(event: str, target: int) -> int | None:
        """The process group `event(target, ...)` signals; None where it signals one pid."""
        if event == "os.killpg":
            return os.getpgrp() if target == 0 else target
        if target == 0:
            return os.getpgrp()
        return -target if target < -1 else None

    def aims_at_agent(self, event: str, target: int) -> bool:
        """Would `os.kill(target, ...)` / `os.killpg(target, ...)` reach the agent, or a
        process between this rank and it?"""
        if event == "os.kill" and (
            target == self.agent_pid or target == -1 or target in self.between
        ):
            return True
        group = self._group_of(event, target)
        if group is None:
            return False
        return (self.agent_pgid is not None and group == self.agent_pgid) or (
            group in self.between_groups
        )

    def _hook(self, event: str, args: tuple[object, ...]) -> None:
        if event not in self._events or not self._armed or getattr(self._inside, "busy", False):
            return
        self._inside.busy = True
        try:  # never let the hook break the caller's os.kill
            target, sig = args[0], args[1]
            if not isinstance(target, int) or not isinstance(sig, int):
                return  # os.kill refuses these itself
            target, sig = int(target), int(sig)
            if sig == 0 or not self.aims_at_agent(event, target):
                return
            self._armed = False
            test = self.current_test()
            name = _signal_name(sig)
            if event == "os.kill" and target == self.agent_pid:
                whom, aimed = f"its torchrun agent (pid {self.agent_pid})", target
            elif event == "os.kill" and target in self.between:
                whom = f"{self.between[target]} (pid {target}; torchrun agent pid {self.agent_pid})"
                aimed = target
            else:
                group = self._group_of(event, target)
                aimed = -(group if group is not None else abs(target))
                if group in self.between_groups and group != self.agent_pgid:
                    whom = (
                        f"the process group of {self.between_groups[group]} ({event}({target}); "
                        f"torchrun agent pid {self.agent_pid})"
                    )
                else:
                    whom = (
                        f"its torchrun agent's process group ({event}({target}); agent pid "
                        f"{self.agent_pid})"
                    )
            where = f"during {test}" if test else "outside any test"
            self.on_break(
                WorldBreak(
                    action="signalled-agent",
                    test=test,
                    at=time.time(),
                    message=(
                        f"rank {self.rank} sent {name} to {whom} {where}, which ends the job "
                        "for every rank"
                    ),
                    signal=name,
                    target=aimed,
                )
            )
        except Exception:  # an audit hook must not raise into the caller's os.kill
            pass
        finally:
            self._inside.busy = False
