"""One bench rank: `torchrun ... -m harness.bench.ranks OPTIONS_JSON OUT` (method: bench/README.md).

Transport: our `gather_queries` + `reduce_outputs` against exactly the collectives
`TorchDCPTransport` calls, on flat buffers of the same sizes and dtypes, in the same iterations.
Capture: the eager step and registry lookups on a registry that never saw the capture machinery
(`plain`), one after a window was opened and closed (`after_window`), and one with a no-op
subscriber left (`noop_subscriber`). Each series becomes its slowest rank per iteration in one
all-reduce (a collective is done when its last rank is); rank 0 summarizes and writes OUT.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
import torch.distributed as dist

from harness.atomic import atomic_write_text
from harness.bench.bare_rank import barrier, run_rank
from harness.bench.report import bandwidth, bus_bytes, paired_ratio, summarize
from harness.capture.check import default_detectors
from harness.capture.window import CaptureWindow
from harness.core.signature import TransportSignature
from harness.rank.bootstrap import RankEnv, exit_now
from harness.schema.bench import (
    BenchOptions,
    CaptureOverhead,
    Results,
    TransportCase,
    TransportResults,
)
from harness.transport.dtypes import output_torch_dtype, query_torch_dtype, wire_dtype
from harness.transport.registry import TransportRegistry
from harness.transport.torch_backend import (
    A2ALayout,
    TorchDCPTransport,
    all_gather_flat,
    reduce_scatter_flat,
)

US = 1e6
Op = Callable[[], object]
Series = dict[str, list[float]]  # "side.op" -> seconds per timed iteration


@dataclass(frozen=True)
class Clock:
    """This rank in the group and the one way every op is timed: barrier (all ranks start
    together), device sync, `perf_counter`, the op, device sync, `perf_counter`."""

    rank: int
    world_size: int
    device: torch.device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, op: Op) -> float:
        barrier(self.device)
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
    sig, gen = t.signature, torch.Generator().manual_seed(seed)
    qdt, dt = query_torch_dtype(sig), output_torch_dtype(sig)
    q = torch.randn(batch, sig.local_heads, sig.query_head_dim, generator=gen).to(t.device, qdt)
    part = torch.randn(batch, sig.total_heads, sig.output_head_dim, generator=gen).to(t.device, dt)
    lse = torch.randn(batch, sig.total_heads, generator=gen).to(t.device)
    gathered = torch.empty(batch, sig.total_heads, sig.query_head_dim, dtype=qdt, device=t.device)
    reduced = torch.empty(batch, sig.local_heads, sig.output_head_dim, dtype=dt, device=t.device)
    return {
        "gather": lambda: t.gather_queries(q, out=gathered),
        "reduce": lambda: t.reduce_outputs(part, lse, out=reduced),
    }


def raw_ops(t: TorchDCPTransport, batch: int) -> tuple[dict[str, Op], dict[str, float]]:
    """The collectives the transport calls for one step, on flat buffers of its sizes and
    dtypes, and the bytes each moves per link (an all-gather's output, another op's input)."""
    sig, w, f32 = t.signature, t.world, torch.float32
    h, big_h, o = sig.local_heads, sig.total_heads, sig.output_head_dim
    native = t.strategy == "ag_rs" and t.reduce_scatter == "native"
    qn = batch * h * sig.query_head_dim
    # The outputs' reduction: a reduce-scatter where the group has one, an all-to-all otherwise.
    rs = reduce_scatter_flat if native else dist.all_to_all_single
    sizes: dict[str, tuple[Callable[..., object], int, int, torch.dtype]] = {  # send, recv n
        "ag_queries": (all_gather_flat, qn, w * qn, wire_dtype(query_torch_dtype(sig)))
    }
    if t.strategy == "ag_rs":
        sizes["ag_lse"] = (all_gather_flat, batch * big_h, w * batch * big_h, f32)
        sizes["rs_outputs"] = (rs, batch * big_h * o, (1 if native else w) * batch * h * o, f32)
    else:
        chunk = A2ALayout.for_batch(batch, h, o, output_torch_dtype(sig).itemsize).chunk_bytes
        sizes["a2a_outputs"] = (dist.all_to_all_single, w * chunk, w * chunk, torch.uint8)
    ops: dict[str, Op] = {}
    moved: dict[str, float] = {}
    for op, (collective, send_n, recv_n, dt) in sizes.items():
        send, recv = (torch.zeros(n, dtype=dt, device=t.device) for n in (send_n, recv_n))
        ops[op] = functools.partial(collective, recv, send, group=t.group)
        moved[op] = bus_bytes((recv if op.startswith("ag_") else send).nbytes, w)
    return ops, moved


def transport_case(
    slow: Mapping[str, np.ndarray], t: TorchDCPTransport, batch: int, moved: Mapping[str, float]
) -> TransportCase:
    """One case from the slowest-rank series (`interleaved`'s, and `raw.reduce_ops`)."""
    us = {k: v * US for k, v in slow.items()}
    ops = {k: summarize(v) for k, v in us.items() if not k.endswith(("step", "reduce_ops"))}
    step = paired_ratio(us["ours.step"], us["raw.step"])
    steps = {"ours.step": step.numerator_median, "raw.step": step.denominator_median}
    bws = [bandwidth(f"raw.{op}", b, ops[f"raw.{op}"].median / US) for op, b in moved.items()]
    bws += [bandwidth(op, sum(moved.values()), median / US) for op, median in steps.items()]
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
                raw, moved = raw_ops(t, batch)
                sides = {"raw": raw, "ours": our_step(t, batch, seed=1000 * clock.rank + batch)}
                series = interleaved(clock, sides, options.warmup, options.iters)
                # The raw reduction: every raw op but the query all-gather.
                series["raw.reduce_ops"] = list(
                    np.subtract(series["raw.step"], series["raw.ag_queries"])
                )
                cases.append(transport_case(clock.slowest(series), t, batch, moved))
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
    strategy, batch = options.strategies[0], options.capture_batch
    sig, names = clock.signature(batch), ("plain", "after_window", "noop_subscriber")
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
        after = regs["after_window"]
        with CaptureWindow(
            default_detectors(after, device=clock.device), registry=after
        ).watching():
            after.get(sig)
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
        barrier(clock.device)
    if clock.rank != 0:
        return None
    return capture_overhead(strategy, batch, {n: slow[f"{n}.eager"] for n in regs}, lookups)


def measure(options: BenchOptions, out: Path, env: RankEnv, device: torch.device) -> None:
    """The wanted sections on every rank; rank 0 writes their results."""
    clock = Clock(env.rank, env.world_size, device)
    cases = measure_transport(clock, options) if options.wants("transport") else None
    capture = measure_capture(clock, options) if options.wants("capture") else None
    if env.rank != 0:
        return
    transport = None
    if cases is not None:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        transport = TransportResults(
            backend=options.backend, world_size=env.world_size, device_name=name, cases=tuple(cases)
        )
    atomic_write_text(out, Results(transport=transport, capture=capture).model_dump_json())


def main(argv: list[str] | None = None) -> NoReturn:
    """Run this rank, then end it without interpreter teardown (`bootstrap.exit_now`)."""
    options_json, out = sys.argv[1:3] if argv is None else argv
    options = BenchOptions.model_validate_json(options_json)
    work = functools.partial(measure, options, Path(out))
    code = run_rank("harness.bench.ranks", options.backend, options.timeout_s, work)
    exit_now(code)


if __name__ == "__main__":
    main()
