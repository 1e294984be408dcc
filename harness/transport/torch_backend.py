"""The DCP transport on torch.distributed (gloo on CPU, NCCL on GPU), one per signature.

Query gather: one `all_gather_single` of the local heads into a rank-major staging buffer,
reordered to `[B, h*dcp, qdim]` (rank r's heads at `[r*h, (r+1)*h)`). The gather moves the
signature's query dtype; gloo has no fp8, so fp8 (e4m3) queries travel as their uint8 bytes
(`wire_dtype`), bit-exact. The reduction works in the signature's output dtype.

Output reduction, two strategies (the combine: `harness.transport.combine`):
- `ag_rs`: all-gather the fp32 LSEs to `[dcp, B, H]`; each rank computes its own row of the
  combine weights (`StagedWeights`: the oracle's bits, on static buffers, without the oracle's
  code) and rescales its own partial for all heads, with
  weight-0 entries forced to exactly 0; then a sum reduce-scatter over heads. The rescaled
  partials and the reduce-scatter stay in fp32 (16-bit sums of 16 ranks would not hold the 2e-2
  tolerance reliably); the cast to the output dtype happens once, at the end.
- `a2a`: one `all_to_all_single` of byte-packed chunks (each destination's head slice of the
  output in its own dtype, then its fp32 LSEs, 8-byte aligned), then the weights
  (`StagedWeights`, written straight into the accumulation's weights buffer) and
  `accumulate_into`'s masked product (one source rank at a time) on the received
  `[dcp, B, h, *]`, as a `StagedAccumulation` on static buffers. Their views and the packing
  views are made once per batch size and kept (`_A2APlan`): at decode batches a step costs
  per-op overhead, not bandwidth. The upcast and mask take several source ranks per op while
  their fp32 staging stays under `_A2A_GROUP_BYTES` (cache-sized), one at a time above.

Which collectives: torch 2.13's gloo supports all_gather, reduce_scatter and all_to_all on CPU
tensors (checked with a 2-rank probe); torch 2.13 names them `all_gather_single` and
`reduce_scatter_single` and warns (FutureWarning) on the old `*_into_tensor`/`*_tensor` names,
so the new names are used when present. Where a process group has no reduce-scatter (older
gloo builds), `reduce_scatter="all_to_all"` gives an exact equivalent: an all-to-all of the
per-destination chunks followed by a local fp32 sum (one extra `[dcp, B, h, odim]` fp32 staging
buffer). The suite runs both implementations and checks they agree.

Each operation calls `on_use(operation, dtype)` (the registry's first-use report) after its
inputs are checked and before its first collective, so a strict capture window stops a lazy
first use on every rank before any rank enters the exchange.

Staging buffers are sized for `signature.max_tokens` and allocated once, at creation, through
the registry's allocator; a larger batch raises `CapacityError`. Outputs go into `out=` when
given, else into a fresh tensor (caller-owned, so earlier results are never overwritten).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import torch
import torch.distributed as dist

from harness.core.signature import TransportSignature
from harness.errors import GeometryError
from harness.transport.allocator import Allocator
from harness.transport.checks import OperationGuard, UseHook
from harness.transport.combine import StagedAccumulation, same_width_int, scale_into
from harness.transport.dtypes import output_torch_dtype, query_torch_dtype, wire_dtype
from harness.transport.errors import TransportUsageError
from harness.transport.weights import StagedWeights

Strategy = Literal["ag_rs", "a2a"]
ReduceScatterImpl = Literal["native", "all_to_all"]
STRATEGIES: tuple[str, ...] = ("ag_rs", "a2a")
REDUCE_SCATTER_IMPLS: tuple[str, ...] = ("native", "all_to_all")

_ALIGN = 8  # bytes; keeps the fp32 LSE region of a packed A2A chunk viewable as float32
_A2A_GROUP_BYTES = 512 * 1024  # fp32 staging of the source ranks upcast and masked per op


def _first_collective(*names: str) -> Callable[..., object]:
    """The first collective of `names` this torch.distributed has (torch renamed them)."""
    for name in names:
        fn: Callable[..., object] | None = getattr(dist, name, None)
        if fn is not None:
            return fn
    raise ImportError(f"torch.distributed has none of {', '.join(names)}")


all_gather_flat = _first_collective("all_gather_single", "all_gather_into_tensor")
reduce_scatter_flat = _first_collective("reduce_scatter_single", "reduce_scatter_tensor")


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class A2ALayout:
    """Byte layout of one destination's chunk in the packed A2A exchange, for a batch size."""

    out_bytes: int
    lse_offset: int
    lse_bytes: int
    chunk_bytes: int

    @classmethod
    def for_batch(cls, batch: int, local_heads: int, odim: int, elsize: int) -> A2ALayout:
        out_bytes = batch * local_heads * odim * elsize
        lse_offset = _align(out_bytes)
        lse_bytes = batch * local_heads * 4
        return cls(out_bytes, lse_offset, lse_bytes, lse_offset + _align(lse_bytes))


def a2a_group(batch: int, local_heads: int, odim: int, world: int) -> int:
    """Source ranks per upcast-and-mask op: as many as fit `_A2A_GROUP_BYTES` of fp32, >= 1."""
    return max(1, min(world, _A2A_GROUP_BYTES // (batch * local_heads * odim * 4)))


@dataclass(frozen=True)
class _A2APlan:
    """One batch size's views of the A2A staging, made on its first reduction and kept."""

    send: torch.Tensor  # the packed chunks, flat bytes
    recv: torch.Tensor
    send_outputs: torch.Tensor  # [B, dcp, h, odim]: the partial's layout, into the chunks
    send_lses: torch.Tensor  # [B, dcp, h]
    recv_lses: torch.Tensor  # [dcp, B, h]
    weights: StagedWeights  # of recv_lses, into accumulate.weights
    accumulate: StagedAccumulation  # over the received [dcp, B, h, odim]


def _split(flat: torch.Tensor, shape: tuple[int, int, int], rows: int) -> list[torch.Tensor]:
    """Views of `flat`: one `shape` `[W, B, H]`, then `rows` of `[B, H]`, back to back."""
    w, b, heads = shape
    first = flat[: w * b * heads].view(shape)
    rest = flat[w * b * heads : (w + rows) * b * heads].view(rows, b, heads).unbind(0)
    return [first, *rest]


def reduce_scatter_via_all_to_all(
    out: torch.Tensor, inp: torch.Tensor, scratch: torch.Tensor, group: dist.ProcessGroup | None
) -> None:
    """Sum reduce-scatter of `inp` ([W*n], chunk r for rank r) into `out` ([n]) by all-to-all.

    Exact equivalent of a native reduce-scatter for groups that lack one; `scratch` is [W*n].
    """
    world = dist.get_world_size(group)
    dist.all_to_all_single(scratch, inp, group=group)
    torch.sum(scratch.view(world, -1), dim=0, out=out)


class TorchDCPTransport(OperationGuard):
    """Query gather and LSE-weighted reduction over one DCP process group (see module doc)."""

    backend = "torch"

    def __init__(
        self,
        signature: TransportSignature,
        group: dist.ProcessGroup | None,
        *,
        allocator: Allocator,
        strategy: str = "ag_rs",
        reduce_scatter: str = "native",
        on_use: UseHook | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise GeometryError(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}")
        if reduce_scatter not in REDUCE_SCATTER_IMPLS:
            raise GeometryError(
                f"unknown reduce_scatter {reduce_scatter!r}; expected {REDUCE_SCATTER_IMPLS}"
            )
        self.signature = signature
        self.group = group
        self.strategy = strategy
        self.reduce_scatter = reduce_scatter
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.device = allocator.device
        if self.world != signature.dcp_world_size:
            raise GeometryError(
                f"transport [{signature.describe()}] needs a DCP group of "
                f"{signature.dcp_world_size} ranks, got a group of {self.world}"
            )
        if self.device.type != signature.device_type:
            raise GeometryError(
                f"transport [{signature.describe()}] is for {signature.device_type}, "
                f"the registry allocates on {self.device}"
            )
        super().__init__(on_use)
        self._buffers: dict[str, torch.Tensor] = {}
        self._a2a_plans: dict[int, _A2APlan] = {}
        self._ag_weights: dict[int, StagedWeights] = {}
        self._allocate(allocator)

    # -- creation ---------------------------------------------------------------------------

    def _allocate(self, allocator: Allocator) -> None:
        sig, w = self.signature, self.world
        t, h, big_h = sig.max_tokens, sig.local_heads, sig.total_heads
        q, o, f32 = sig.query_head_dim, sig.output_head_dim, torch.float32
        qwire, dt = wire_dtype(query_torch_dtype(sig)), output_torch_dtype(sig)

        def buf(name: str, numel: int, dtype: torch.dtype) -> None:
            self._buffers[name] = allocator.empty((numel,), dtype, owner=sig, name=name)

        buf("gather_send", t * h * q, qwire)
        buf("gather_recv", w * t * h * q, qwire)
        if self.strategy == "ag_rs":
            buf("lse_send", t * big_h, f32)
            buf("lse_recv", w * t * big_h, f32)
            buf("lse_work", (w + 3) * t * big_h, f32)  # StagedWeights' work, peak, norm, out
            buf("rs_send", t * big_h * o, f32)
            buf("rs_recv", t * h * o, f32)
            if self.reduce_scatter == "all_to_all":
                buf("rs_scratch", w * t * h * o, f32)
        else:
            chunk = A2ALayout.for_batch(t, h, o, dt.itemsize).chunk_bytes
            buf("a2a_send", w * chunk, torch.uint8)
            buf("a2a_recv", w * chunk, torch.uint8)
            buf("a2a_acc", t * h * o, f32)
            # Any batch's group fits: a2a_group(B) * B <= max(B, _A2A_GROUP_BYTES // row), <= W*B.
            row = h * o * f32.itemsize
            buf("a2a_scratch", min(w * t, max(t, _A2A_GROUP_BYTES // row)) * h * o, f32)
            buf("a2a_lse_work", (w + 2) * t * h, f32)  # StagedWeights' work, peak, norm
            buf("a2a_weights", w * t * h, f32)
            buf("a2a_keep", w * t * h, same_width_int(dt))

    @property
    def buffers(self) -> Mapping[str, int]:
        """Staging buffer name -> bytes (what creation allocated)."""
        return MappingProxyType({k: v.nbytes for k, v in self._buffers.items()})

    def close(self) -> None:
        """Drop the staging buffers and the group reference; any later call raises."""
        self._buffers.clear()
        self._a2a_plans.clear()
        self._ag_weights.clear()
        self.group = None
        self.closed = True

    @staticmethod
    def _out(out: torch.Tensor | None, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        if out is None:
            return torch.empty(shape, dtype=like.dtype, device=like.device)
        if not out.is_contiguous():
            raise TransportUsageError("out must be contiguous")
        return out

    # -- query gather -----------------------------------------------------------------------

    def gather_queries(
        self, q_local: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[B, h, qdim] -> [B, h*dcp, qdim], rank r's heads at [r*h, (r+1)*h); bit-exact."""
        b = self._begin_gather(q_local, out)
        sig, w = self.signature, self.world
        h, q = sig.local_heads, sig.query_head_dim
        n = b * h * q
        send = self._buffers["gather_send"][:n]
        wire = send.dtype
        send.view(b, h, q).copy_(q_local.view(wire))
        recv = self._buffers["gather_recv"][: w * n]
        all_gather_flat(recv, send, group=self.group)
        result = self._out(out, (b, sig.total_heads, q), q_local)
        result.view(wire).view(b, w, h, q).copy_(recv.view(w, b, h, q).transpose(0, 1))
        return result

    # -- output reduction -------------------------------------------------------------------

    def reduce_outputs(
        self,
        partial_out: torch.Tensor,
        partial_lse: torch.Tensor,
        out: torch.Tensor | None = None,
        *,
        base_e: bool = True,
    ) -> torch.Tensor:
        """[B, H, odim] + fp32 [B, H] -> this rank's combined heads [B, H/dcp, odim].

        `base_e=False` when the LSEs are log2 (exp2/log2 combine).
        """
        b = self._begin_reduce(partial_out, partial_lse, out)
        sig = self.signature
        shape = (b, sig.local_heads, sig.output_head_dim)
        result = self._out(out, shape, partial_out)
        if self.strategy == "ag_rs":
            self._reduce_ag_rs(partial_out, partial_lse, result, b, base_e)
        else:
            self._reduce_a2a(partial_out, partial_lse, result, b, base_e)
        return result

    def _reduce_ag_rs(
        self, part: torch.Tensor, lse: torch.Tensor, result: torch.Tensor, b: int, base_e: bool
    ) -> None:
        sig, w, bufs = self.signature, self.world, self._buffers
        h, big_h, o = sig.local_heads, sig.total_heads, sig.output_head_dim
        lse_send = bufs["lse_send"][: b * big_h]
        lse_send.view(b, big_h).copy_(lse)
        lse_recv = bufs["lse_recv"][: w * b * big_h]
        all_gather_flat(lse_recv, lse_send, group=self.group)
        weigh = self._ag_weights.get(b) or self._ag_weights_of(b)
        weights = weigh(lse_recv.view(w, b, big_h), base_e=base_e)
        rs_send = bufs["rs_send"][: b * big_h * o]
        # Rescaled straight into the send buffer, destination rank-major, in fp32.
        scale_into(
            rs_send.view(w, b, h, o),
            part.reshape(b, w, h, o).transpose(0, 1),
            weights.view(b, w, h).transpose(0, 1),
        )
        rs_recv = bufs["rs_recv"][: b * h * o]
        if self.reduce_scatter == "native":
            assert reduce_scatter_flat is not None
            reduce_scatter_flat(rs_recv, rs_send, group=self.group)
        else:
            scratch = bufs["rs_scratch"][: w * b * h * o]
            reduce_scatter_via_all_to_all(rs_recv, rs_send, scratch, self.group)
        result.copy_(rs_recv.view(b, h, o))

    def _reduce_a2a(
        self, part: torch.Tensor, lse: torch.Tensor, result: torch.Tensor, b: int, base_e: bool
    ) -> None:
        sig, w = self.signature, self.world
        plan = self._a2a_plans.get(b) or self._a2a_plan(b)
        plan.send_outputs.copy_(part.reshape(b, w, sig.local_heads, sig.output_head_dim))
        plan.send_lses.copy_(lse.reshape(b, w, sig.local_heads))
        dist.all_to_all_single(plan.recv, plan.send, group=self.group)
        plan.weights(plan.recv_lses, base_e=base_e)
        result.copy_(plan.accumulate.accumulate())

    def _ag_weights_of(self, b: int) -> StagedWeights:
        """Batch `b`'s weights step (views of the staging only), kept."""
        w, big_h = self.world, self.signature.total_heads
        work, peak, norm, out = _split(self._buffers["lse_work"], (w, b, big_h), 3)
        weigh = StagedWeights(work=work, peak=peak, norm=norm, out=out, row=self.rank)
        self._ag_weights[b] = weigh
        return weigh

    def _a2a_plan(self, b: int) -> _A2APlan:
        """Batch `b`'s views of the staging (views only: nothing is allocated), kept."""
        sig, w, bufs = self.signature, self.world, self._buffers
        h, o = sig.local_heads, sig.output_head_dim
        lay = A2ALayout.for_batch(b, h, o, output_torch_dtype(sig).itemsize)
        send = bufs["a2a_send"][: w * lay.chunk_bytes]
        recv = bufs["a2a_recv"][: w * lay.chunk_bytes]
        weights = bufs["a2a_weights"][: w * b * h].view(w, b, h)
        work, peak, norm = _split(bufs["a2a_lse_work"], (w, b, h), 2)
        accumulate = StagedAccumulation(
            bufs["a2a_acc"][: b * h * o].view(b, h, o),
            self._outputs_of(recv, lay, b),
            weights=weights,
            keep=bufs["a2a_keep"][: w * b * h].view(w, b, h),
            scratch=bufs["a2a_scratch"],
            group=a2a_group(b, h, o, w),
        )
        plan = _A2APlan(
            send=send,
            recv=recv,
            send_outputs=self._outputs_of(send, lay, b).transpose(0, 1),
            send_lses=self._lses_of(send, lay, b).transpose(0, 1),
            recv_lses=self._lses_of(recv, lay, b),
            weights=StagedWeights(work=work, peak=peak, norm=norm, out=weights),
            accumulate=accumulate,
        )
        self._a2a_plans[b] = plan
        return plan

    def _outputs_of(self, packed: torch.Tensor, lay: A2ALayout, b: int) -> torch.Tensor:
        sig = self.signature
        chunks = packed.view(self.world, lay.chunk_bytes)[:, : lay.out_bytes]
        return chunks.view(output_torch_dtype(sig)).view(
            self.world, b, sig.local_heads, sig.output_head_dim
        )

    def _lses_of(self, packed: torch.Tensor, lay: A2ALayout, b: int) -> torch.Tensor:
        chunks = packed.view(self.world, lay.chunk_bytes)
        region = chunks[:, lay.lse_offset : lay.lse_offset + lay.lse_bytes]
        return region.view(torch.float32).view(self.world, b, self.signature.local_heads)
