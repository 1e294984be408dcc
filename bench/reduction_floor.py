"""The floor of the transport's local reduction work: one pass over the data, with as many
processes as ranks sharing the machine's cores, against the steps the torch transport runs.

`python bench/reduction_floor.py [--procs 16] [--batch 64 [B ...]]` (method and reading:
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

from harness.transport.combine import (
    StagedAccumulation,
    accumulate_into,
    combine_weights,
    same_width_int,
    scale_into,
)
from harness.transport.torch_backend import A2ALayout, a2a_group
from harness.transport.weights import StagedWeights

WORLD, HEADS, OUT_DIM = 16, 96, 512
Seconds = dict[str, list[float]]  # step -> seconds per timed iteration
LOCAL = HEADS // WORLD
# One-pass candidates per strategy (each reads the input once and writes the output once);
# the floor is the fastest of them (a mixed-dtype multiply with `out=` can be the slower one).
FLOORS = {"ag_rs": ("ag_rs upcast copy", "ag_rs fused multiply"), "a2a": ("a2a sum", "a2a copy")}
TRANSPORT = {  # the torch transport's local steps, per strategy, in the order it runs them
    "ag_rs": ("ag_rs weights", "ag_rs scale_into", "ag_rs result"),
    "a2a": ("a2a pack", "a2a weights", "a2a StagedAccumulation", "a2a result"),
}
# The reduction itself: the one step of each strategy that reads all of the partials.
REDUCTION = {"ag_rs": "ag_rs scale_into", "a2a": "a2a StagedAccumulation"}
# Timed for reference, in no sum: the A2A accumulation before its staging.
REFERENCE = ("a2a accumulate_into",)


def _packed(flat: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A2A's chunks as `TorchDCPTransport` views them: outputs `[W, B, h, D]` (bf16) and LSEs
    `[W, B, h]` (fp32), both strided into one destination-major byte buffer."""
    lay = A2ALayout.for_batch(batch, LOCAL, OUT_DIM, torch.bfloat16.itemsize)
    chunks = flat[: WORLD * lay.chunk_bytes].view(WORLD, lay.chunk_bytes)
    outputs = chunks[:, : lay.out_bytes].view(torch.bfloat16).view(WORLD, batch, LOCAL, OUT_DIM)
    lses = chunks[:, lay.lse_offset : lay.lse_offset + lay.lse_bytes].view(torch.float32)
    return outputs, lses.view(WORLD, batch, LOCAL)


def _chunk_bytes(batch: int) -> int:
    return A2ALayout.for_batch(batch, LOCAL, OUT_DIM, torch.bfloat16.itemsize).chunk_bytes


def steps(batch: int, seed: int) -> dict[str, Callable[[], object]]:
    """Each step on tensors laid out as `TorchDCPTransport` lays them out (views, buffers and
    the A2A staging made once, as the transport makes them on a batch size's first step)."""
    gen = torch.Generator().manual_seed(seed)
    part = torch.randn(batch, HEADS, OUT_DIM, generator=gen).to(torch.bfloat16)
    lse = torch.randn(batch, HEADS, generator=gen)
    result = torch.empty(batch, LOCAL, OUT_DIM, dtype=torch.bfloat16)
    # AG+RS: the gathered LSEs, rank 0's weights, the fp32 send buffer (destination-major).
    lse_all = torch.randn(WORLD, batch, HEADS, generator=gen)
    send = torch.empty(WORLD, batch, LOCAL, OUT_DIM)
    src = part.reshape(batch, WORLD, LOCAL, OUT_DIM).transpose(0, 1)
    w_ag = combine_weights(lse_all).weights[0].view(batch, WORLD, LOCAL).transpose(0, 1)
    rs_recv = torch.randn(batch * LOCAL * OUT_DIM, generator=gen)
    # A2A: the packed send and receive buffers, the received chunks filled as if exchanged.
    send_outputs, send_lses = _packed(
        torch.empty(WORLD * _chunk_bytes(batch), dtype=torch.uint8), batch
    )
    received, recv_lses = _packed(
        torch.empty(WORLD * _chunk_bytes(batch), dtype=torch.uint8), batch
    )
    received.copy_(torch.randn(received.shape, generator=gen))
    recv_lses.copy_(torch.randn(recv_lses.shape, generator=gen))
    w_a2a = combine_weights(recv_lses).weights
    group = a2a_group(batch, LOCAL, OUT_DIM, WORLD)
    acc = torch.zeros(batch, LOCAL, OUT_DIM)
    staged = StagedAccumulation(
        acc,
        received,
        weights=torch.empty(WORLD, batch, LOCAL),
        keep=torch.empty(WORLD, batch, LOCAL, dtype=same_width_int(received.dtype)),
        scratch=torch.empty(min(group, WORLD) * acc.numel()),
        group=group,
    )
    contiguous = torch.empty(received.shape, dtype=torch.bfloat16)
    weigh_ag = StagedWeights(
        work=torch.empty(WORLD, batch, HEADS),
        peak=torch.empty(batch, HEADS),
        norm=torch.empty(batch, HEADS),
        out=torch.empty(batch, HEADS),
        row=0,
    )
    weigh_a2a = StagedWeights(
        work=torch.empty(WORLD, batch, LOCAL),
        peak=torch.empty(batch, LOCAL),
        norm=torch.empty(batch, LOCAL),
        out=staged.weights,
    )
    weigh_a2a(recv_lses)

    def pack() -> tuple[torch.Tensor, torch.Tensor]:
        send_outputs.transpose(0, 1).copy_(part.reshape(batch, WORLD, LOCAL, OUT_DIM))
        send_lses.transpose(0, 1).copy_(lse.reshape(batch, WORLD, LOCAL))
        return send_outputs, send_lses

    return {
        # One read of the bf16 partial, one write of the fp32 send buffer (unscaled, scaled).
        "ag_rs upcast copy": lambda: send.copy_(src),
        "ag_rs fused multiply": lambda: torch.mul(src, w_ag.unsqueeze(-1), out=send),
        "ag_rs weights": lambda: weigh_ag(lse_all),
        "ag_rs scale_into": lambda: scale_into(send, src, w_ag),
        "ag_rs result": lambda: result.copy_(rs_recv.view(batch, LOCAL, OUT_DIM)),
        # One read of the received partials: their fp32 sum (not even weighted), or a copy.
        "a2a sum": lambda: torch.sum(received, 0, dtype=torch.float32, out=acc),
        "a2a copy": lambda: contiguous.copy_(received),
        "a2a pack": pack,
        "a2a weights": lambda: weigh_a2a(recv_lses),
        "a2a StagedAccumulation": staged.accumulate,
        "a2a result": lambda: result.copy_(acc),
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
    """One line per step (median and p10-p90 in ms), then per strategy its reduction step and
    all of its local steps, each as a multiple of the one-pass floor."""
    med = {name: float(np.median(s)) for name, s in slowest.items()}
    lines = [
        f"{name:24s} {med[name] * 1e3:8.2f} ms  (p10-p90 "
        f"{np.percentile(s, 10) * 1e3:.2f}-{np.percentile(s, 90) * 1e3:.2f})"
        for name, s in slowest.items()
    ]
    for strategy, names in TRANSPORT.items():
        floor = min(med[n] for n in FLOORS[strategy])
        reduction, ours = med[REDUCTION[strategy]], sum(med[n] for n in names)
        lines.append(
            f"{strategy}: one-pass floor {floor * 1e3:.2f} ms; {REDUCTION[strategy]} "
            f"{reduction * 1e3:.2f} ms = {reduction / floor:.2f}x; transport's local steps "
            f"{ours * 1e3:.2f} ms = {ours / floor:.2f}x"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=16, help="processes, as ranks (16)")
    parser.add_argument(
        "--batch", type=int, nargs="+", default=[64], help="decode batch sizes B, in turn (64)"
    )
    parser.add_argument("--iters", type=int, default=30, help="timed iterations (30)")
    parser.add_argument("--warmup", type=int, default=3, help="discarded iterations (3)")
    args = parser.parse_args(argv)
    if min(args.procs, *args.batch, args.iters) < 1 or args.warmup < 0:
        print("reduction_floor: --procs, --batch and --iters must be >= 1", file=sys.stderr)
        return 2
    for batch in args.batch:
        slowest = measure(args.procs, batch, args.iters, args.warmup)
        print(f"{args.procs} processes on {mp.cpu_count()} CPUs, B = {batch}:")
        print("\n".join(report(slowest)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
