"""Entry point of one bench rank: `torchrun ... -m harness.bench.rank --out FILE ...`.

Every rank measures; rank 0 gathers every rank's raw samples and writes them to `--out` as JSON.
The driver does all the statistics, so this side stays small and imports nothing of it. A rank
that cannot run the requested backend exits 3 with one line on stderr, before any collective.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.bench.rank_capture import measure_capture_overhead
from harness.bench.rank_env import BACKENDS, BenchBackendError, RankEnv
from harness.bench.rank_transport import measure_transport

RAW_SCHEMA = "dcpqual-bench-rank/v1"
EXIT_BACKEND = 3


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="harness.bench.rank")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--backend", default="gloo", choices=BACKENDS)
    p.add_argument("--strategies", default="ag_rs,a2a")
    p.add_argument("--batches", default="1,8,64", type=_ints)
    p.add_argument("--warmup", default=5, type=int)
    p.add_argument("--iters", default=50, type=int)
    p.add_argument("--skip-transport", action="store_true")
    p.add_argument("--capture", action="store_true", help="also measure capture overhead")
    p.add_argument("--capture-batch", default=8, type=int)
    p.add_argument("--capture-iters", default=100, type=int)
    p.add_argument("--lookup-rounds", default=21, type=int)
    p.add_argument("--lookup-loops", default=2000, type=int)
    return p.parse_args(argv)


def measure(env: RankEnv, args: argparse.Namespace) -> dict[str, Any]:
    strategies = [s for s in args.strategies.split(",") if s]
    mine: dict[str, Any] = {"rank": env.rank, "pid": os.getpid()}
    if not args.skip_transport:
        mine["transport"] = measure_transport(
            env, strategies, args.batches, args.warmup, args.iters
        )
    if args.capture:
        mine["capture"] = measure_capture_overhead(
            env,
            strategy=strategies[0],
            batch=args.capture_batch,
            warmup=args.warmup,
            iters=args.capture_iters,
            lookup_rounds_n=args.lookup_rounds,
            lookup_loops=args.lookup_loops,
        )
    return mine


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        env = RankEnv.init(args.backend)
    except BenchBackendError as exc:
        print(f"harness.bench.rank: {exc}", file=sys.stderr)
        return EXIT_BACKEND
    try:
        mine = measure(env, args)
        every: list[Any] = [None] * env.world_size
        dist.all_gather_object(every, mine)
        if env.rank == 0:
            payload = {
                "schema": RAW_SCHEMA,
                "backend": env.backend,
                "world_size": env.world_size,
                "device": str(env.device),
                "device_name": torch.cuda.get_device_name(env.device)
                if env.device.type == "cuda"
                else "cpu",
                "torch": torch.__version__,
                "ranks": every,
            }
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(payload))
            tmp.replace(args.out)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
