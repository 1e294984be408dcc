"""Rank side of the transport measurement: our gather + reduction against the raw collectives
that move the same bytes, timed in the same iterations.

What the raw side runs is what `TorchDCPTransport` itself calls (torch_backend.py), on
preallocated flat buffers of the same sizes and dtypes, with no copies or arithmetic:
- query gather: one flat all-gather of the bf16 local queries `[B, h, 576]`;
- `ag_rs` reduction: a flat all-gather of the fp32 LSEs `[B, H]`, then a sum reduce-scatter of
  the fp32 rescaled partials `[B, H, 512]` (fp32 because the transport reduces in fp32; an
  all-to-all of the same bytes where the group has no reduce-scatter, as the transport does);
- `a2a` reduction: one `all_to_all_single` of the byte-packed chunks (`A2ALayout`).
So the ratio ours/raw is the cost of everything the transport adds around the wire: staging
copies, the combine arithmetic, checks, Python.

Iterations alternate which side runs first, so drift in machine load falls on both equally.
Our calls pass `out=` (static outputs, as a captured decode step would).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from harness.bench.rank_env import RankEnv
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
KIMI_HEADS = 96
QUERY_DIM = 576
OUTPUT_DIM = 512
DTYPE = "bf16"

Op = Callable[[], object]


def kimi_signature(world: int, max_tokens: int, device_type: str) -> TransportSignature:
    return TransportSignature(
        dtype=DTYPE,
        total_heads=KIMI_HEADS,
        query_head_dim=QUERY_DIM,
        output_head_dim=OUTPUT_DIM,
        dcp_world_size=world,
        max_tokens=max_tokens,
        device_type=device_type,
    )


@dataclass
class Inputs:
    """One decode step's tensors at batch `batch`, plus static outputs for `out=`."""

    q: torch.Tensor
    part: torch.Tensor
    lse: torch.Tensor
    gathered: torch.Tensor
    reduced: torch.Tensor

    @classmethod
    def make(cls, sig: TransportSignature, batch: int, device: torch.device, seed: int) -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        qdt, dt = query_torch_dtype(sig), output_torch_dtype(sig)
        h, big_h = sig.local_heads, sig.total_heads
        q, o = sig.query_head_dim, sig.output_head_dim
        return cls(
            q=torch.randn(batch, h, q, generator=gen).to(device=device, dtype=qdt),
            part=torch.randn(batch, big_h, o, generator=gen).to(device=device, dtype=dt),
            lse=torch.randn(batch, big_h, generator=gen).to(device=device),
            gathered=torch.empty(batch, big_h, q, dtype=qdt, device=device),
            reduced=torch.empty(batch, h, o, dtype=dt, device=device),
        )


def our_ops(transport: TorchDCPTransport, x: Inputs) -> dict[str, Op]:
    return {
        "gather": lambda: transport.gather_queries(x.q, out=x.gathered),
        "reduce": lambda: transport.reduce_outputs(x.part, x.lse, out=x.reduced),
    }


def raw_ops(
    transport: TorchDCPTransport, batch: int, device: torch.device
) -> tuple[dict[str, Op], dict[str, dict[str, int]]]:
    """The raw collectives of one step, and the bytes each sends and receives per rank."""
    sig, w, group = transport.signature, transport.world, transport.group
    h, big_h, q, o = sig.local_heads, sig.total_heads, sig.query_head_dim, sig.output_head_dim
    qdt, dt, f32 = wire_dtype(query_torch_dtype(sig)), output_torch_dtype(sig), torch.float32

    def flat(numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(numel, dtype=dtype, device=device)

    q_send, q_recv = flat(batch * h * q, qdt), flat(w * batch * h * q, qdt)
    ops: dict[str, Op] = {"ag_queries": lambda: all_gather_flat(q_recv, q_send, group=group)}
    if transport.strategy == "ag_rs":
        l_send, l_recv = flat(batch * big_h, f32), flat(w * batch * big_h, f32)
        rs_send, rs_recv = flat(batch * big_h * o, f32), flat(batch * h * o, f32)
        ops["ag_lse"] = lambda: all_gather_flat(l_recv, l_send, group=group)
        if transport.reduce_scatter == "native":
            assert reduce_scatter_flat is not None
            rs = reduce_scatter_flat
            ops["rs_outputs"] = lambda: rs(rs_recv, rs_send, group=group)
        else:
            scratch = flat(w * batch * h * o, f32)
            ops["rs_outputs"] = lambda: dist.all_to_all_single(scratch, rs_send, group=group)
    else:
        chunk = A2ALayout.for_batch(batch, h, o, dt.itemsize).chunk_bytes
        a_send, a_recv = flat(w * chunk, torch.uint8), flat(w * chunk, torch.uint8)
        ops["a2a_outputs"] = lambda: dist.all_to_all_single(a_recv, a_send, group=group)
    nbytes = {
        "ag_queries": {"send": q_send.nbytes, "recv": q_recv.nbytes},
        **(
            {
                "ag_lse": {"send": l_send.nbytes, "recv": l_recv.nbytes},
                "rs_outputs": {"send": rs_send.nbytes, "recv": rs_recv.nbytes},
            }
            if transport.strategy == "ag_rs"
            else {"a2a_outputs": {"send": a_send.nbytes, "recv": a_recv.nbytes}}
        ),
    }
    return ops, nbytes


def run_interleaved(
    env: RankEnv, sides: Mapping[str, Mapping[str, Op]], warmup: int, iters: int
) -> dict[str, dict[str, list[float]]]:
    """Time every op of every side in each iteration, rotating which side goes first.

    Returns side -> op -> seconds per measured iteration (warm-up iterations dropped).
    """
    names = list(sides)
    samples: dict[str, dict[str, list[float]]] = {s: {op: [] for op in sides[s]} for s in names}
    for it in range(warmup + iters):
        shift = it % len(names)
        for side in names[shift:] + names[:shift]:
            for op, fn in sides[side].items():
                seconds = env.timed(fn)
                if it >= warmup:
                    samples[side][op].append(seconds)
    return samples


def measure_transport(
    env: RankEnv, strategies: list[str], batches: list[int], warmup: int, iters: int
) -> list[dict[str, Any]]:
    """One case per (strategy, batch): this rank's samples for ours and raw, and the bytes."""
    sig = kimi_signature(env.world_size, max(batches), env.device.type)
    cases = []
    for strategy in strategies:
        with TransportRegistry("torch", strategy, env.device) as registry:
            transport = registry.get_or_create(sig)
            assert isinstance(transport, TorchDCPTransport)
            for batch in batches:
                x = Inputs.make(sig, batch, env.device, seed=1000 * env.rank + batch)
                raw, nbytes = raw_ops(transport, batch, env.device)
                samples = run_interleaved(
                    env, {"raw": raw, "ours": our_ops(transport, x)}, warmup, iters
                )
                cases.append(
                    {
                        "strategy": strategy,
                        "reduce_scatter": transport.reduce_scatter,
                        "batch": batch,
                        "signature": sig.to_json(),
                        "bytes": nbytes,
                        "samples": samples,
                    }
                )
    return cases
