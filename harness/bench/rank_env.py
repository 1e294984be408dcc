"""What a bench rank needs from its process group: who it is, where its tensors live, and a timer
that measures one collective the same way for every variant.

Rank side only (run under torchrun by the bench driver): imports torch and nothing of the driver.
Timing protocol, identical for our transport and for the raw collectives: barrier (so every rank
starts together and none carries the previous op's skew), device sync, `perf_counter`, the op,
device sync, `perf_counter`. The driver later takes the slowest rank per iteration: a collective
is done when its last rank is done.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

BACKENDS: tuple[str, ...] = ("gloo", "nccl")


class BenchBackendError(RuntimeError):
    """This machine cannot run the requested backend (NCCL without enough GPUs)."""


def nccl_unavailable_reason(world_size: int) -> str | None:
    """Why `--backend nccl` cannot run here at `world_size` ranks, or None when it can."""
    if not torch.cuda.is_available():
        return (
            f"--backend nccl needs CUDA GPUs; this torch ({torch.__version__}) reports "
            "torch.cuda.is_available() == False"
        )
    if not dist.is_nccl_available():
        return f"--backend nccl: this torch build ({torch.__version__}) has no NCCL"
    count = torch.cuda.device_count()
    if count < world_size:
        return f"--backend nccl at {world_size} ranks needs {world_size} GPUs, {count} visible"
    return None


@dataclass(frozen=True)
class RankEnv:
    """This rank in an initialized default process group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @classmethod
    def init(cls, backend: str) -> RankEnv:
        """Join torchrun's group (env:// rendezvous); on NCCL, bind this rank's GPU first."""
        if backend not in BACKENDS:
            raise BenchBackendError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if backend == "nccl":
            reason = nccl_unavailable_reason(int(os.environ.get("LOCAL_WORLD_SIZE", world)))
            if reason is not None:
                raise BenchBackendError(reason)
            device = torch.device("cuda", local)
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo")
        return cls(dist.get_rank(), dist.get_world_size(), local, backend, device)

    def barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, op: Callable[[], object]) -> float:
        """Seconds this rank spent in `op`, starting together with the other ranks."""
        self.barrier()
        self.sync()
        t0 = time.perf_counter()
        op()
        self.sync()
        return time.perf_counter() - t0
