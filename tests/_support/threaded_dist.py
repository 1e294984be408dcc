"""A DCP group of W ranks as W threads of the test process, for the torch transport's unit tests.

The transport's collectives (all-gather, reduce-scatter, all-to-all of flat tensors) are
replaced by exchanges through a barrier, so its routing and reduction run in the pytest process
itself: no spawned ranks, and coverage tools (mutmut's per-test selection among them) see every
line. The semantics are torch.distributed's: chunk r of a flat buffer belongs to rank r.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch


class ThreadWorld:
    """W threads that meet at a barrier to swap one value each."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._barrier = threading.Barrier(size, timeout=60)
        self._slots: list[Any] = [None] * size

    def exchange(self, rank: int, value: Any) -> list[Any]:
        self._slots[rank] = value
        self._barrier.wait()
        every = list(self._slots)
        self._barrier.wait()
        return every


@dataclass(frozen=True)
class Member:
    """One rank's handle on its world: what the transport holds as its process group."""

    world: ThreadWorld
    rank: int


def _chunks(tensor: torch.Tensor, size: int) -> torch.Tensor:
    return tensor.reshape(size, -1)


def all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group: Member) -> None:
    parts = group.world.exchange(group.rank, inp.clone())
    out.copy_(torch.cat([p.reshape(-1) for p in parts]))


def reduce_scatter_flat(out: torch.Tensor, inp: torch.Tensor, group: Member) -> None:
    parts = group.world.exchange(group.rank, inp.clone())
    total = torch.zeros_like(out)
    for part in parts:
        total += _chunks(part, group.world.size)[group.rank].view_as(out)
    out.copy_(total)


def all_to_all_single(out: torch.Tensor, inp: torch.Tensor, group: Member) -> None:
    parts = group.world.exchange(group.rank, inp.clone())
    mine = [_chunks(p, group.world.size)[group.rank] for p in parts]
    _chunks(out, group.world.size).copy_(torch.stack(mine))


def fake_dist() -> SimpleNamespace:
    """What `harness.transport.torch_backend` calls on `torch.distributed`."""
    return SimpleNamespace(
        get_world_size=lambda group: group.world.size,
        get_rank=lambda group: group.rank,
        all_to_all_single=lambda out, inp, group=None: all_to_all_single(out, inp, group),
    )


def patch_torch_backend(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    """Point the torch transport module's collectives at the thread world."""
    monkeypatch.setattr(module, "dist", fake_dist())
    monkeypatch.setattr(
        module, "all_gather_flat", lambda o, i, group=None: all_gather_flat(o, i, group)
    )
    monkeypatch.setattr(
        module, "reduce_scatter_flat", lambda o, i, group=None: reduce_scatter_flat(o, i, group)
    )


def run_ranks(size: int, body: Callable[[Member], Any]) -> list[Any]:
    """`body(member)` on `size` threads; their results in rank order, the first error raised."""
    world = ThreadWorld(size)
    results: list[Any] = [None] * size
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = body(Member(world, rank))
        except BaseException as exc:  # re-raised in the test's thread below
            errors.append(exc)
            world._barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return results
