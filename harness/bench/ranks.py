"""One bench rank: `torchrun ... -m harness.bench.ranks OPTIONS_JSON OUT` (method: bench/README.md).

Transport: our `gather_queries` + `reduce_outputs` against exactly the collectives
`TorchDCPTransport` calls, on flat buffers of the same sizes and dtypes, in the same iterations.
Capture: the eager step and registry lookups on a registry that never saw the capture machinery
(`plain`), one after a window was opened and closed (`after_window`), and one with a no-op
subscriber left (`noop_subscriber`). Each series becomes its slowest rank per iteration in one
all-reduce (a collective is done when its last rank is); rank 0 summarizes and writes OUT.

Shutdown is symmetric: every rank waits at a barrier until rank 0 has written, all leave the
group, and each ends with `os._exit` (interpreter teardown with c10d's threads alive can die in
C++ with `terminate called without an active exception`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from harness.atomic import atomic_write_text
from harness.bench.stats import bandwidth, bus_bytes, paired_ratio, summarize
from harness.capture.check import default_detectors
from harness.capture.window import CaptureWindow
from harness.core.signature import TransportSignature
from harness.rank.bootstrap import BootstrapError, RankEnv, init_process_group, teardown
from harness.schema.bench import (
    BenchOptions,
    CaptureOverhead,
    Results,
    TransportCase,
    TransportResults,
)
from harness.transport.registry import TransportRegistry
from harness.transport.torch_backend import (
    A2ALayout,
    TorchDCPTransport,
    all_gather_flat,
    reduce_scatter_flat,
)
from harness.warm.signature import output_torch_dtype, query_torch_dtype, wire_dtype

US = 1e6
EXIT_BACKEND = 3  # this rank cannot run the backend: one line on stderr, before any collective
Op = Callable[[], object]
Series = dict[str, list[float]]  # "side.op" -> seconds per timed iteration


@dataclass(frozen=True)
class Clock:
    """This rank in the group and the one way every op is timed: barrier (all ranks start
    together), device sync, `perf_counter`, the op, device sync, `perf_counter`."""

    rank: int
    world_size: int
    device: torch.device

    def barrier(self) -> None:
        cuda = self.device.type == "cuda"
        dist.barrier(device_ids=[self.device.index] if cuda else None)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, op: Op) -> float:
        self.barrier()
        self.sync()
        t0 = time.perf_counter()
        op()
        self.sync()
        return time.perf_counter() - t0

    def slowest(self, series: Series) -> dict[str, np.ndarray]:
        """Per series and iteration, the slowest rank's seconds."""
        names = sorted(series)
        local = torch.tensor([series[n] for n in names], dtype=torch.float64, device=self.device)
        dist.all_reduce(local, op=dist.ReduceOp.MAX)
        return dict(zip(names, local.cpu().numpy(), strict=True))

    def signature(self, max_tokens: int) -> TransportSignature:
        """Kimi-K3 at TP16/DCP16: 96 heads, 576-wide query head, 512-wide output head, bf16."""
        return TransportSignature(
            "bf16", 96, 576, 512, self.world_size, max_tokens, self.device.type
        )


def interleaved(
    clock: Clock, sides: Mapping[str, Mapping[str, Op]], warmup: int, iters: int
) -> Series:
    """Seconds per timed iteration of every side's ops and of its step (their sum, per rank:
    before the slowest rank is taken); which side goes first rotates."""
    names = list(sides)
    out: Series = {f"{s}.{op}": [] for s in names for op in [*sides[s], "step"]}
    for it in range(warmup + iters):
        for side in names[it % len(names) :] + names[: it % len(names)]:
            took = {f"{side}.{op}": clock.timed(fn) for op, fn in sides[side].items()}
            for key, seconds in {**took, f"{side}.step": sum(took.values())}.items():
                if it >= warmup:
                    out[key].append(seconds)
    return out


def our_step(t: TorchDCPTransport, batch: int, seed: int) -> dict[str, Op]:
    """One decode step's two transport calls on fixed inputs, into static outputs (`out=`)."""
    sig, device, gen = t.signature, t.device, torch.Generator().manual_seed(seed)
    qdt, dt, h, big_h = (
        query_torch_dtype(sig),
        output_torch_dtype(sig),
        sig.local_heads,
        sig.total_heads,
    )
    q = torch.randn(batch, h, sig.query_head_dim, generator=gen).to(device, qdt)
    part = torch.randn(batch, big_h, sig.output_head_dim, generator=gen).to(device, dt)
    lse = torch.randn(batch, big_h, generator=gen).to(device)
    gathered = torch.empty(batch, big_h, sig.query_head_dim, dtype=qdt, device=device)
    reduced = torch.empty(batch, h, sig.output_head_dim, dtype=dt, device=device)
    return {
        "gather": lambda: t.gather_queries(q, out=gathered),
        "reduce": lambda: t.reduce_outputs(part, lse, out=reduced),
    }


def raw_ops(t: TorchDCPTransport, batch: int) -> tuple[dict[str, Op], dict[str, tuple[int, int]]]:
    """The collectives the transport calls for one step, and the bytes each sends and receives."""
    sig, w, group, f32 = t.signature, t.world, t.group, torch.float32
    h, big_h, o = sig.local_heads, sig.total_heads, sig.output_head_dim
    a2a_chunk = A2ALayout.for_batch(batch, h, o, output_torch_dtype(sig).itemsize).chunk_bytes
    native = t.strategy == "ag_rs" and t.reduce_scatter == "native"
    qn = batch * h * sig.query_head_dim
    sizes = {"ag_queries": (qn, w * qn, wire_dtype(query_torch_dtype(sig)))}  # send, recv, dtype
    if t.strategy == "ag_rs":  # without a reduce-scatter in the group the transport all-to-alls
        sizes["ag_lse"] = (batch * big_h, w * batch * big_h, f32)
        sizes["rs_outputs"] = (batch * big_h * o, (1 if native else w) * batch * h * o, f32)
    else:
        sizes["a2a_outputs"] = (w * a2a_chunk, w * a2a_chunk, torch.uint8)
    bufs = {
        op: (
            torch.zeros(send, dtype=dt, device=t.device),
            torch.zeros(recv, dtype=dt, device=t.device),
        )
        for op, (send, recv, dt) in sizes.items()
    }

    def call(op: str) -> Op:
        send, recv = bufs[op]
        if op.startswith("ag_"):
            return lambda: all_gather_flat(recv, send, group=group)
        if op == "rs_outputs" and native:
            assert reduce_scatter_flat is not None
            return lambda: reduce_scatter_flat(recv, send, group=group)
        return lambda: dist.all_to_all_single(recv, send, group=group)

    return {op: call(op) for op in bufs}, {op: (s.nbytes, r.nbytes) for op, (s, r) in bufs.items()}


def transport_case(
    slow: Mapping[str, np.ndarray],
    t: TorchDCPTransport,
    batch: int,
    nbytes: Mapping[str, tuple[int, int]],
) -> TransportCase:
    """One case from the slowest-rank series (`interleaved`'s, and `raw.reduce_ops`)."""
    us = {k: v * US for k, v in slow.items()}
    ops = {k: summarize(v) for k, v in us.items() if not k.endswith(("step", "reduce_ops"))}
    moved = {op: bus_bytes(op, send, recv, t.world) for op, (send, recv) in nbytes.items()}
    step = paired_ratio(us["ours.step"], us["raw.step"])
    bws = [bandwidth(f"raw.{op}", moved[op], ops[f"raw.{op}"].median / US) for op in nbytes]
    bws += [
        bandwidth(f"{side}.step", sum(moved.values()), median / US)
        for side, median in (("ours", step.numerator_median), ("raw", step.denominator_median))
    ]
    return TransportCase(
        strategy=t.strategy,
        reduce_scatter=t.reduce_scatter,
        batch=batch,
        world_size=t.world,
        ours_step_us=summarize(us["ours.step"]),
        raw_step_us=summarize(us["raw.step"]),
        ratio=step,
        gather_ratio=paired_ratio(us["ours.gather"], us["raw.ag_queries"]),
        reduce_ratio=paired_ratio(us["ours.reduce"], us["raw.reduce_ops"]),
        ops_us=ops,
        bandwidth=tuple(bws),
    )


def measure_transport(clock: Clock, options: BenchOptions) -> list[TransportCase]:
    sig, cases = clock.signature(max(options.batches)), []
    for strategy in options.strategies:
        with TransportRegistry("torch", strategy, clock.device) as registry:
            t = registry.get_or_create(sig)
            assert isinstance(t, TorchDCPTransport)
            for batch in options.batches:
                raw, nbytes = raw_ops(t, batch)
                sides = {"raw": raw, "ours": our_step(t, batch, seed=1000 * clock.rank + batch)}
                series = interleaved(clock, sides, options.warmup, options.iters)
                # The raw reduction: every raw op but the query all-gather.
                series["raw.reduce_ops"] = list(
                    np.subtract(series["raw.step"], series["raw.ag_queries"])
                )
                cases.append(transport_case(clock.slowest(series), t, batch, nbytes))
    return cases


def capture_overhead(
    strategy: str, batch: int, steps: Mapping[str, np.ndarray], lookups: Series
) -> CaptureOverhead:
    """Each variant against `plain`: eager steps (slowest rank) and lookups (rank 0), paired."""
    others = [v for v in steps if v != "plain"]
    step_ratio = {v: paired_ratio(steps[v], steps["plain"]) for v in others}
    return CaptureOverhead(
        strategy=strategy,
        batch=batch,
        overhead_pct=(step_ratio["after_window"].value - 1.0) * 100.0,
        step_us={v: summarize(s * US) for v, s in steps.items()},
        lookup_ns={v: summarize(np.asarray(s) * 1e9) for v, s in lookups.items()},
        step_ratio=step_ratio,
        lookup_ratio={v: paired_ratio(lookups[v], lookups["plain"]) for v in others},
    )


def measure_capture(clock: Clock, options: BenchOptions) -> CaptureOverhead | None:
    """The capture overhead on rank 0; None on the others (they take part in the steps)."""
    strategy, batch, sig = (
        options.strategies[0],
        options.capture_batch,
        clock.signature(options.capture_batch),
    )
    names = ("plain", "after_window", "noop_subscriber")
    with contextlib.ExitStack() as stack:
        regs = {
            n: stack.enter_context(TransportRegistry("torch", strategy, clock.device))
            for n in names
        }

        def eager(reg: TransportRegistry) -> Op:
            """What an eager decode step does: a registry lookup, then the two calls."""
            t = reg.get_or_create(sig)
            assert isinstance(t, TorchDCPTransport)
            ops = our_step(t, batch, seed=7 + clock.rank)
            return lambda: (reg.get(sig), *(op() for op in ops.values()))

        steps = {name: {"eager": eager(reg)} for name, reg in regs.items()}
        # The state between captures: every detector's hooks installed for one window, removed.
        with CaptureWindow(
            default_detectors(regs["after_window"], device=clock.device),
            registry=regs["after_window"],
        ).watching():
            regs["after_window"].get(sig)
        regs["noop_subscriber"].subscribe(lambda event: None)
        slow = clock.slowest(interleaved(clock, steps, options.warmup, options.capture_iters))
        # Lookups are local: rank 0 loops while the others wait at the barrier, so oversubscribed
        # cores do not turn descheduling into lookup time.
        lookups: Series = {n: [] for n in names}
        for r in range(options.lookup_rounds if clock.rank == 0 else 0):
            for name in names[r % 3 :] + names[: r % 3]:
                get, t0 = regs[name].get, time.perf_counter()
                for _ in range(options.lookup_loops):
                    get(sig)
                lookups[name].append((time.perf_counter() - t0) / options.lookup_loops)
        clock.barrier()
    if clock.rank != 0:
        return None
    return capture_overhead(strategy, batch, {n: slow[f"{n}.eager"] for n in regs}, lookups)


def run(options: BenchOptions, out: Path) -> int:
    env = RankEnv.from_env()
    try:
        device = init_process_group(options.backend, env, timedelta(seconds=options.timeout_s))
    except BootstrapError as exc:
        print(f"harness.bench.ranks: {exc}", file=sys.stderr)
        return EXIT_BACKEND
    clock = Clock(env.rank, env.world_size, device)
    try:
        cases = measure_transport(clock, options) if options.wants("transport") else None
        capture = measure_capture(clock, options) if options.wants("capture") else None
        if env.rank == 0:
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
            transport = None
            if cases is not None:
                transport = TransportResults(
                    backend=options.backend,
                    world_size=env.world_size,
                    device_name=name,
                    cases=tuple(cases),
                )
            atomic_write_text(out, Results(transport=transport, capture=capture).model_dump_json())
        clock.barrier()  # nobody leaves while rank 0 still writes
    finally:
        teardown()
    return 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        code = run(BenchOptions.model_validate_json(args[0]), Path(args[1]))
    except BaseException:  # a failing rank says why; torchrun then ends its peers
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)  # the group is gone: skip interpreter teardown with c10d threads alive


if __name__ == "__main__":
    main()
