"""Shared bits of the rank suites: this rank, the faulty rank, a small collective."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def rank() -> int:
    return dist.get_rank()


def fault_rank() -> int:
    return int(os.environ.get("DCPQUAL_FAULT_RANK", "1"))


def all_reduce_sum(value: float) -> float:
    t = torch.tensor([value])
    dist.all_reduce(t)
    return float(t.item())
