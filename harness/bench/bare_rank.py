"""Every bench rank's life, and the bare launch a full suite run is compared with.

A bench rank joins the group as the rank plugin does (`harness.rank.bootstrap`, with a timeout),
does its work, waits at a barrier for every rank (rank 0 may still be writing) and leaves the
group. With one all-reduce as its work this is the bare launch: `dcpqual run`'s torchrun flags
and bootstrap without suites, rank plugin or bundle, ending as a plain Python process ends. It
imports only torch and the bootstrap, so the ratio isolates what everything else adds.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from harness.rank.bootstrap import BootstrapError, RankEnv, init_process_group, teardown

EXIT_BACKEND = 3  # this rank cannot run the backend: one line on stderr, before any collective
Work = Callable[[RankEnv, torch.device], None]


def run_rank(name: str, backend: str, timeout_s: float, work: Work) -> int:
    """Join, work, wait for all, leave; the exit code. A failing rank prints why (1; torchrun
    then ends its peers); one that cannot join says why in one line (3)."""
    try:
        env = RankEnv.from_env()
        device = init_process_group(backend, env, timedelta(seconds=timeout_s))
    except BootstrapError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_BACKEND
    try:
        try:
            work(env, device)
            barrier(device)
        finally:
            teardown()
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def barrier(device: torch.device) -> None:
    """Every rank of the group here (NCCL told which GPU is this rank's)."""
    dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)


def all_reduce_once(env: RankEnv, device: torch.device) -> None:
    value = torch.ones(1, device=device)
    dist.all_reduce(value)
    if int(value.item()) != env.world_size:
        raise RuntimeError(f"bare launch: all_reduce gave {value.item()}, not {env.world_size}")


if __name__ == "__main__":
    raise SystemExit(
        run_rank("harness.bench.bare_rank", sys.argv[1], float(sys.argv[2]), all_reduce_once)
    )
