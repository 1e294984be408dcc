"""The floor of the transport's local reduction work: one pass over the data, with as many
processes as ranks sharing the machine's cores, against the steps the torch transport runs.

`python bench/reduction_floor.py [--procs 16] [--batch 64]` (method and reading:
bench/README.md). Kimi-K3 TP16/DCP16 shapes: 16 partials, 96 heads, 6 per rank, 512 outputs,
bf16 partials, fp32 LSEs and combine. Every process times every step of one iteration between
barriers, so all of them contend for the cores at once, as 16 ranks do between collectives; a
step's time in an iteration is its slowest process's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier

import numpy as np
import torch

from harness.transport.combine import accumulate_into, combine_weights, scale_into

WORLD, HEADS, OUT_DIM = 16, 96, 512
Seconds = dict[str, list[float]]  # step -> seconds per timed iteration
LOCAL = HEADS // WORLD
# One-pass candidates per strategy (each reads the input once and writes the output once);
# the floor is the fastest of them (a mixed-dtype multiply with `out=` can be the slower one).
FLOORS = {"ag_rs": ("ag_rs upcast copy", "ag_rs fused multiply"), "a2a": ("a2a sum", "a2a copy")}
TRANSPORT = {  # the torch transport's local steps, per strategy
    "ag_rs": ("ag_rs weights", "ag_rs scale_into"),
    "a2a": ("a2a pack", "a2a weights", "a2a accumulate_into"),
}


def steps(batch: int, seed: int) -> dict[str, Callable[[], object]]:
    """Each step on tensors laid out as `TorchDCPTransport` lays them out."""
    gen = torch.Generator().manual_seed(seed)
    part = torch.randn(batch, HEADS, OUT_DIM, generator=gen).to(torch.bfloat16)
    lse_all = torch.randn(WORLD, batch, HEADS, generator=gen)  # gathered LSEs (AG+RS)
    send = torch.empty(WORLD, batch, LOCAL, OUT_DIM)  # fp32, destination rank-major
    src = part.reshape(batch, WORLD, LOCAL, OUT_DIM).transpose(0, 1)
    w_ag = combine_weights(lse_all).weights[0].view(batch, WORLD, LOCAL).transpose(0, 1)
    received = torch.randn(WORLD, batch, LOCAL, OUT_DIM, generator=gen).to(torch.bfloat16)
    packed = torch.empty_like(received)
    lse_a2a = torch.randn(WORLD, batch, LOCAL, generator=gen)
    w_a2a = combine_weights(lse_a2a).weights
    acc = torch.zeros(batch, LOCAL, OUT_DIM)
    return {
        # One read of the bf16 partial, one write of the fp32 send buffer (unscaled, scaled).
        "ag_rs upcast copy": lambda: send.copy_(src),
        "ag_rs fused multiply": lambda: torch.mul(src, w_ag.unsqueeze(-1), out=send),
        "ag_rs weights": lambda: combine_weights(lse_all).weights[0],
        "ag_rs scale_into": lambda: scale_into(send, src, w_ag),
        # One read of the received partials: their fp32 sum (not even weighted), or a copy.
        "a2a sum": lambda: torch.sum(received, 0, dtype=torch.float32, out=acc),
        "a2a copy": lambda: packed.copy_(received),
        "a2a pack": lambda: packed.copy_(
            part.reshape(batch, WORLD, LOCAL, OUT_DIM).transpose(0, 1)
        ),
        "a2a weights": lambda: combine_weights(lse_a2a).weights,
        "a2a accumulate_into": lambda: accumulate_into(acc.zero_(), received, w_a2a),
    }


def time_steps(
    batch: int, iters: int, warmup: int, seed: int, barrier: Barrier | None = None
) -> Seconds:
    """Seconds per step and timed iteration, in this process."""
    torch.set_num_threads(1)  # as a rank under torchrun (OMP_NUM_THREADS=1)
    work = steps(batch, seed)
    seconds: Seconds = {name: [] for name in work}
    for i in range(warmup + iters):
        for name, step in work.items():
            if barrier is not None:
                barrier.wait()
            t0 = time.perf_counter()
            step()
            elapsed = time.perf_counter() - t0
            if i >= warmup:
                seconds[name].append(elapsed)
    return seconds


def _worker(args: tuple[int, int, int, int, Barrier, Queue[Seconds]]) -> None:
    batch, iters, warmup, seed, barrier, queue = args
    queue.put(time_steps(batch, iters, warmup, seed, barrier))


def measure(procs: int, batch: int, iters: int, warmup: int) -> dict[str, np.ndarray]:
    """Per step, the slowest process's seconds in each iteration (forked workers)."""
    ctx = mp.get_context("fork")  # the workers inherit torch; no intra-op pool exists yet
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    workers = [
        ctx.Process(target=_worker, args=((batch, iters, warmup, seed, barrier, queue),))
        for seed in range(procs)
    ]
    for worker in workers:
        worker.start()
    results = [queue.get() for _ in workers]
    for worker in workers:
        worker.join()
        if worker.exitcode:
            raise SystemExit(f"a worker exited with {worker.exitcode}")
    return {name: np.max([r[name] for r in results], axis=0) for name in results[0]}


def report(slowest: dict[str, np.ndarray]) -> list[str]:
    """One line per step (median and p10-p90 in ms), then each strategy against its floor."""
    med = {name: float(np.median(s)) for name, s in slowest.items()}
    lines = [
        f"{name:22s} {med[name] * 1e3:8.2f} ms  (p10-p90 "
        f"{np.percentile(s, 10) * 1e3:.2f}-{np.percentile(s, 90) * 1e3:.2f})"
        for name, s in slowest.items()
    ]
    for strategy, names in TRANSPORT.items():
        ours = sum(med[n] for n in names)
        floor = min(med[n] for n in FLOORS[strategy])
        lines.append(
            f"{strategy}: transport's local steps {ours * 1e3:.2f} ms = {ours / floor:.2f}x "
            f"the one-pass floor {floor * 1e3:.2f} ms"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=16, help="processes, as ranks (16)")
    parser.add_argument("--batch", type=int, default=64, help="decode batch B (64)")
    parser.add_argument("--iters", type=int, default=30, help="timed iterations (30)")
    parser.add_argument("--warmup", type=int, default=3, help="discarded iterations (3)")
    args = parser.parse_args(argv)
    if min(args.procs, args.batch, args.iters) < 1 or args.warmup < 0:
        print("reduction_floor: --procs, --batch and --iters must be >= 1", file=sys.stderr)
        return 2
    slowest = measure(args.procs, args.batch, args.iters, args.warmup)
    print(f"{args.procs} processes on {mp.cpu_count()} CPUs, B = {args.batch}:")
    print("\n".join(report(slowest)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
