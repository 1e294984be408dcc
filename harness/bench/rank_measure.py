"""Rank side of the transport and capture measurements (method: bench/README.md).

Transport: our `gather_queries` + `reduce_outputs` against exactly the collectives
`TorchDCPTransport` calls, on preallocated flat buffers of the same sizes and dtypes, timed in
the same iterations (which side goes first alternates). Capture: the eager step and registry
lookups on a registry that never saw the capture machinery (`plain`), one after a window was
opened and closed (`after_window`), and one with a no-op subscriber left (`noop_subscriber`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from harness.bench.rank import Clock, RankSpec
from harness.transport.registry import TransportRegistry
from harness.transport.torch_backend import (
    A2ALayout,
    TorchDCPTransport,
    all_gather_flat,
    reduce_scatter_flat,
)
from harness.warm.signature import (
    TransportSignature,
    output_torch_dtype,
    query_torch_dtype,
    wire_dtype,
)

# Kimi-K3 TP16/DCP16 (domain.md section 1): 96 heads, 576-wide query head, 512-wide output head.
KIMI_HEADS, QUERY_DIM, OUTPUT_DIM = 96, 576, 512
Op = Callable[[], object]


def kimi_signature(world: int, max_tokens: int, device_type: str) -> TransportSignature:
    return TransportSignature(
        "bf16", KIMI_HEADS, QUERY_DIM, OUTPUT_DIM, world, max_tokens, device_type
    )


@dataclass
class Inputs:
    """One decode step's tensors at one batch size, plus static outputs for `out=`."""

    q: torch.Tensor
    part: torch.Tensor
    lse: torch.Tensor
    gathered: torch.Tensor
    reduced: torch.Tensor

    @classmethod
    def make(cls, sig: TransportSignature, batch: int, device: torch.device, seed: int) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        qdt, dt = query_torch_dtype(sig), output_torch_dtype(sig)
        h, big_h, q, o = sig.local_heads, sig.total_heads, sig.query_head_dim, sig.output_head_dim
        return cls(
            q=torch.randn(batch, h, q, generator=gen).to(device=device, dtype=qdt),
            part=torch.randn(batch, big_h, o, generator=gen).to(device=device, dtype=dt),
            lse=torch.randn(batch, big_h, generator=gen).to(device=device),
            gathered=torch.empty(batch, big_h, q, dtype=qdt, device=device),
            reduced=torch.empty(batch, h, o, dtype=dt, device=device),
        )

    def step(self, transport: TorchDCPTransport) -> dict[str, Op]:
        return {
            "gather": lambda: transport.gather_queries(self.q, out=self.gathered),
            "reduce": lambda: transport.reduce_outputs(self.part, self.lse, out=self.reduced),
        }


def raw_ops(
    t: TorchDCPTransport, batch: int, device: torch.device
) -> tuple[dict[str, Op], dict[str, dict[str, int]]]:
    """The raw collectives of one step, and the bytes each sends and receives per rank."""
    sig, w, group = t.signature, t.world, t.group
    h, big_h, q, o = sig.local_heads, sig.total_heads, sig.query_head_dim, sig.output_head_dim
    f32 = torch.float32
    bufs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def pair(op: str, send: int, recv: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        bufs[op] = (
            torch.zeros(send, dtype=dtype, device=device),
            torch.zeros(recv, dtype=dtype, device=device),
        )
        return bufs[op]

    qs, qr = pair(
        "ag_queries", batch * h * q, w * batch * h * q, wire_dtype(query_torch_dtype(sig))
    )
    ops: dict[str, Op] = {"ag_queries": lambda: all_gather_flat(qr, qs, group=group)}
    if t.strategy == "ag_rs":
        ls, lr = pair("ag_lse", batch * big_h, w * batch * big_h, f32)
        ops["ag_lse"] = lambda: all_gather_flat(lr, ls, group=group)
        if t.reduce_scatter == "native":
            rs, rr = pair("rs_outputs", batch * big_h * o, batch * h * o, f32)
            native = reduce_scatter_flat
            assert native is not None
            ops["rs_outputs"] = lambda: native(rr, rs, group=group)
        else:  # no reduce-scatter in this group: the transport (and so we) all-to-all the bytes
            rs, rr = pair("rs_outputs", batch * big_h * o, w * batch * h * o, f32)
            ops["rs_outputs"] = lambda: dist.all_to_all_single(rr, rs, group=group)
    else:
        chunk = A2ALayout.for_batch(batch, h, o, output_torch_dtype(sig).itemsize).chunk_bytes
        a_s, a_r = pair("a2a_outputs", w * chunk, w * chunk, torch.uint8)
        ops["a2a_outputs"] = lambda: dist.all_to_all_single(a_r, a_s, group=group)
    return ops, {op: {"send": s.nbytes, "recv": r.nbytes} for op, (s, r) in bufs.items()}


def interleaved(
    clock: Clock, sides: dict[str, dict[str, Op]], warmup: int, iters: int
) -> dict[str, dict[str, list[float]]]:
    """side -> op -> seconds per timed iteration; which side goes first rotates."""
    names = list(sides)
    samples: dict[str, dict[str, list[float]]] = {s: {op: [] for op in sides[s]} for s in names}
    for it in range(warmup + iters):
        shift = it % len(names)
        for side in names[shift:] + names[:shift]:
            for op, fn in sides[side].items():
                seconds = clock.timed(fn)
                if it >= warmup:
                    samples[side][op].append(seconds)
    return samples


def measure_transport(clock: Clock, spec: RankSpec) -> list[dict[str, Any]]:
    sig = kimi_signature(clock.world_size, max(spec.batches), clock.device.type)
    cases = []
    for strategy in spec.strategies:
        with TransportRegistry("torch", strategy, clock.device) as registry:
            transport = registry.get_or_create(sig)
            assert isinstance(transport, TorchDCPTransport)
            for batch in spec.batches:
                x = Inputs.make(sig, batch, clock.device, seed=1000 * clock.rank + batch)
                raw, nbytes = raw_ops(transport, batch, clock.device)
                sides = {"raw": raw, "ours": x.step(transport)}
                cases.append(
                    {
                        "strategy": strategy,
                        "reduce_scatter": transport.reduce_scatter,
                        "batch": batch,
                        "signature": sig.to_json(),
                        "bytes": nbytes,
                        "samples": interleaved(clock, sides, spec.warmup, spec.iters),
                    }
                )
    return cases


def _open_and_close_window(registry: TransportRegistry, sig: TransportSignature) -> str | None:
    """Build the default detectors, open and close one window (a hit inside); else why not."""
    try:
        from harness.capture.check import default_detectors
        from harness.capture.window import CaptureWindow
    except ImportError as exc:
        return f"capture API not importable ({exc})"
    window = CaptureWindow(default_detectors(registry, device=registry.device), registry=registry)
    with window.watching():
        registry.get(sig)
    return None


def measure_capture(clock: Clock, spec: RankSpec) -> dict[str, Any]:
    strategy, batch = spec.strategies[0], spec.capture_batch
    sig = kimi_signature(clock.world_size, batch, clock.device.type)
    names = ("plain", "after_window", "noop_subscriber")
    registries = {n: TransportRegistry("torch", strategy, clock.device) for n in names}
    try:
        for registry in registries.values():
            registry.get_or_create(sig)
        unavailable = _open_and_close_window(registries["after_window"], sig)
        if unavailable is not None:
            registries.pop("after_window").close()
        registries["noop_subscriber"].subscribe(lambda event: None)
        x = Inputs.make(sig, batch, clock.device, seed=7 + clock.rank)

        def step(reg: TransportRegistry) -> Op:
            def run() -> None:
                transport = reg.get(sig)
                assert isinstance(transport, TorchDCPTransport)
                for op in x.step(transport).values():
                    op()

            return run

        steps = interleaved(
            clock,
            {n: {"step": step(r)} for n, r in registries.items()},
            spec.warmup,
            spec.capture_iters,
        )
        # Lookups are local: rank 0 loops while the others wait, so oversubscribed cores do not
        # turn descheduling into lookup time.
        lookups: dict[str, list[float]] = {n: [] for n in registries} if clock.rank == 0 else {}
        for r in range(spec.lookup_rounds if clock.rank == 0 else 0):
            order = (
                list(registries)[r % len(registries) :] + list(registries)[: r % len(registries)]
            )
            for name in order:
                get = registries[name].get
                t0 = time.perf_counter()
                for _ in range(spec.lookup_loops):
                    get(sig)
                lookups[name].append((time.perf_counter() - t0) / spec.lookup_loops)
        clock.barrier()
    finally:
        for registry in registries.values():
            registry.close()
    return {
        "strategy": strategy,
        "batch": batch,
        "unavailable": unavailable,
        "step": {name: side["step"] for name, side in steps.items()},
        "lookup": lookups,
    }


def measure(clock: Clock, spec: RankSpec) -> dict[str, Any]:
    """This rank's raw samples for the sections the spec asks for."""
    mine: dict[str, Any] = {}
    if spec.transport:
        mine["transport"] = measure_transport(clock, spec)
    if spec.capture:
        mine["capture"] = measure_capture(clock, spec)
    return mine
