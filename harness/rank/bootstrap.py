"""Rank bootstrap: the process group from torchrun's environment, with an explicit timeout.

Why explicit: gloo's and NCCL's default timeout is 30 minutes, so a lost peer would hold every
other rank that long. The rank plugin passes a timeout a little above the per-test timeout; its
watchdog normally ends a stuck test first, and this bound is the backstop.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from harness.rank.openfiles import flush_open_files

BACKENDS: tuple[str, ...] = ("gloo", "nccl")


class BootstrapError(RuntimeError):
    """The rank cannot join the job (bad environment, backend unavailable, rendezvous failed)."""


@dataclass(frozen=True)
class RankEnv:
    """Where torchrun placed this process: global and local rank, node (group) rank, sizes."""

    rank: int
    world_size: int
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    restart_count: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise BootstrapError(f"RANK={self.rank} outside WORLD_SIZE={self.world_size}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RankEnv:
        env = os.environ if env is None else env
        try:
            return cls(
                rank=int(env["RANK"]),
                world_size=int(env["WORLD_SIZE"]),
                local_rank=int(env.get("LOCAL_RANK", "0")),
                local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1")),
                node_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", "0"))),
                restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
            )
        except KeyError as exc:
            raise BootstrapError(f"not under torchrun: environment variable {exc} unset") from None
        except ValueError as exc:
            raise BootstrapError(f"bad torchrun environment: {exc}") from None

    @staticmethod
    def present(env: Mapping[str, str] | None = None) -> bool:
        env = os.environ if env is None else env
        return "RANK" in env and "WORLD_SIZE" in env


def device_for(backend: str, env: RankEnv) -> torch.device:
    """The device this rank computes on: its local GPU under NCCL, else the CPU."""
    if backend == "nccl":
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def init_process_group(backend: str, env: RankEnv, timeout: timedelta) -> torch.device:
    """Join the default process group (env:// rendezvous set up by torchrun); returns the device.

    NCCL gets `device_id`, which binds the communicator to this rank's GPU eagerly, so a bad
    GPU shows up here and not inside the first test's collective.
    """
    if backend not in BACKENDS:
        raise BootstrapError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if dist.is_initialized():
        return device_for(str(dist.get_backend()), env)
    device = device_for(backend, env)
    device_id: torch.device | None = None
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise BootstrapError("backend nccl needs CUDA, and torch.cuda.is_available() is False")
        if env.local_rank >= torch.cuda.device_count():
            raise BootstrapError(
                f"LOCAL_RANK={env.local_rank} but only {torch.cuda.device_count()} GPU(s) visible"
            )
        torch.cuda.set_device(device)
        device_id = device
    try:
        dist.init_process_group(
            backend=backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            device_id=device_id,
        )
    except (RuntimeError, ValueError) as exc:
        raise BootstrapError(f"init_process_group({backend}) failed: {exc}") from exc
    return device


def teardown() -> None:
    """Leave the process group. Safe to call twice or when it never formed."""
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_now(code: int) -> NoReturn:
    """End the rank process without interpreter teardown, once its files are final.

    Why: torch's teardown costs each rank seconds on a few cores, and with c10d's threads still
    alive it can die in C++ (`terminate called without an active exception`). Logging, the
    files a test left open (`harness.rank.openfiles`) and the standard streams are flushed
    first, so no output is lost.
    """
    logging.shutdown()
    with contextlib.suppress(BaseException):  # the rank must still end here
        flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# The binding has it, torch's stubs do not (they list only the setter).
_SEQUENCE_NUMBER = operator.methodcaller("_get_sequence_number_for_group")


def collective_sequence_numbers() -> dict[str, int]:
    """Collective sequence number of each group this rank belongs to, by group name.

    Read from the watchdog thread while the main thread may be blocked in a collective: a rank
    whose number lags a peer's in the same group has not reached the collective they wait in.
    """
    if not dist.is_initialized():
        return {}
    out: dict[str, int] = {}
    for pg, name in list(dist.distributed_c10d._world.pg_names.items()):
        try:
            out[str(name)] = int(_SEQUENCE_NUMBER(pg))
        except (RuntimeError, AttributeError, NotImplementedError):
            continue
    return out
