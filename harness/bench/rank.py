"""Entry point of one bench rank: `torchrun ... -m harness.bench.rank SPEC_JSON OUT`.

Every rank measures; rank 0 gathers every rank's raw samples and writes them to OUT. The driver
does all the statistics, so this side imports nothing of it. The process group comes from
`harness.rank.bootstrap` (with its timeout, so a lost peer cannot hold a rank for 30 minutes).

Shutdown is symmetric: every rank waits at a barrier until rank 0 has written OUT, then all
leave the group together and end with `os._exit`. A rank that tears its gloo context down while
a peer still holds the connections, or runs interpreter teardown (static destructors) with
c10d's threads alive, can die in C++ with `terminate called without an active exception`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from harness.atomic import atomic_write_text
from harness.rank.bootstrap import BootstrapError, RankEnv, init_process_group, teardown

RAW_SCHEMA = "dcpqual-bench-rank/v1"
EXIT_BACKEND = 3  # this rank cannot run the backend: one line on stderr, before any collective


@dataclass(frozen=True)
class RankSpec:
    """What the driver asks every rank to measure (field names as in the driver's options)."""

    backend: str = "gloo"
    strategies: tuple[str, ...] = ("ag_rs", "a2a")
    batches: tuple[int, ...] = (1, 8, 64)
    warmup: int = 5
    iters: int = 50
    transport: bool = True
    capture: bool = True
    capture_batch: int = 8
    capture_iters: int = 200
    lookup_rounds: int = 21
    lookup_loops: int = 2000
    pg_timeout_s: float = 600.0

    @classmethod
    def from_json(cls, text: str) -> RankSpec:
        data = json.loads(text)
        return cls(
            **{**data, "strategies": tuple(data["strategies"]), "batches": tuple(data["batches"])}
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass(frozen=True)
class Clock:
    """This rank in the group, and one way of timing an op for every variant: barrier (all
    ranks start together, none carries the last op's skew), device sync, `perf_counter`, the
    op, device sync, `perf_counter`. The driver takes the slowest rank per iteration."""

    rank: int
    world_size: int
    device: torch.device

    def barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, op: Callable[[], object]) -> float:
        self.barrier()
        self.sync()
        t0 = time.perf_counter()
        op()
        self.sync()
        return time.perf_counter() - t0


def _write(clock: Clock, spec: RankSpec, out: Path, every: list[object]) -> None:
    cuda = clock.device.type == "cuda"
    payload = {
        "schema": RAW_SCHEMA,
        "backend": spec.backend,
        "world_size": clock.world_size,
        "device": str(clock.device),
        "device_name": torch.cuda.get_device_name(clock.device) if cuda else "cpu",
        "torch": torch.__version__,
        "ranks": every,
    }
    atomic_write_text(out, json.dumps(payload))


def run(spec: RankSpec, out: Path) -> int:
    from harness.bench.rank_measure import measure

    env = RankEnv.from_env()
    try:
        device = init_process_group(spec.backend, env, timedelta(seconds=spec.pg_timeout_s))
    except BootstrapError as exc:
        print(f"harness.bench.rank: {exc}", file=sys.stderr)
        return EXIT_BACKEND
    clock = Clock(env.rank, env.world_size, device)
    try:
        mine = {"rank": env.rank, "pid": os.getpid(), **measure(clock, spec)}
        every: list[object] = [None] * env.world_size
        dist.all_gather_object(every, mine)
        if env.rank == 0:
            _write(clock, spec, out, every)
        clock.barrier()  # nobody leaves while rank 0 still writes
    finally:
        teardown()
    return 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        code = run(RankSpec.from_json(args[0]), Path(args[1]))
    except BaseException:  # a failing rank says why; torchrun then ends its peers
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)  # the group is gone: skip interpreter teardown with c10d threads alive


if __name__ == "__main__":
    main()
