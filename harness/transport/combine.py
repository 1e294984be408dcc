"""The DCP output combine: LSE-weighted sum of per-rank partial attention outputs.

This is the oracle every transport is checked against, and also the local step of the A2A
strategy. The math is the definitions of `harness.transport.reference`, written as small named
steps so the unit tests can break each one on purpose and show that the adversarial cases catch
it:

- `sanitize_lse`: NaN or +inf counts as -inf (an empty shard);
- `reference_max`: m = max_n l_n, and 0 where every shard is empty (so no -inf - -inf);
- `combine_weights`: L = m + log sum_n exp(l_n - m), w_n = exp(l_n - L), computed as
  exp(l_n - m) / sum_n exp(l_n - m) (same value, no rounding of the large L);
- `all_empty_guard`: every w_n is 0 where every shard is empty;
- `mask_zero_weight`: w_n * O_n, and exactly 0 where w_n is 0 (even if O_n is NaN).

Everything runs in fp32 (fp64 when an input is fp64) and is cast to the output dtype at the end.

The transports do not call the oracle's allocating steps on their hot path: their weights are
`harness.transport.weights`' (the same bits, pinned against `combine_weights`); `scale_into` and
`accumulate_into` are the same masked product written in place (no full-size fp32 temporaries,
no upcast copy), which is most of what the reduction costs on one CPU thread; and
`StagedAccumulation` is `accumulate_into` over fixed buffers with its views made once, for a
transport that calls it on every step. None reads a value back to the host, so all stay legal
inside a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "CombineWeights",
    "StagedAccumulation",
    "accumulate_into",
    "all_empty_guard",
    "combine_local",
    "combine_weights",
    "compute_dtype",
    "lse_combine",
    "mask_zero_weight",
    "reference_max",
    "same_width_int",
    "sanitize_lse",
    "scale_into",
]


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """fp64 if any input is fp64, else fp32: the combine never accumulates in 16 bits."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def sanitize_lse(lse: torch.Tensor) -> torch.Tensor:
    """NaN and +inf become -inf: a shard that reports them is treated as empty."""
    bad = torch.isnan(lse) | torch.isposinf(lse)
    return torch.where(bad, -torch.inf, lse)


def reference_max(lse: torch.Tensor) -> torch.Tensor:
    """max over ranks (dim 0) of sanitized LSEs; 0 where every rank is empty, so no NaN later."""
    m = lse.amax(dim=0)
    return torch.where(torch.isfinite(m), m, 0.0)


def mask_zero_weight(outputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`weights[..., None] * outputs`, exactly 0 where the weight is 0 (0 * NaN would be NaN)."""
    w = weights.unsqueeze(-1)
    return torch.where(w > 0, outputs * w, 0.0)


_SAME_WIDTH_INT: dict[int, torch.dtype] = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def scale_into(dst: torch.Tensor, outputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`mask_zero_weight(outputs, weights)` written into `dst` (any strides on the inputs).

    Three cheap in-place steps on `dst`: the upcast copy of the outputs, the multiply by the
    weights, then a bitwise AND of each (row of) element(s) with all ones, or with all zeros
    where the weight is 0, which leaves exactly +0 there whatever the product was (0 * NaN).
    One multiply that reads the strided 16-bit outputs and a masked fill after it (or a
    select) cost about three times as much on one CPU thread: a broadcast boolean mask is the
    slow part, a broadcast integer AND is as cheap as the multiply. Bit for bit the same as
    multiply-then-fill, for any weights (a -0 or NaN weight included)."""
    w = weights.unsqueeze(-1)
    dst.copy_(outputs)
    dst.mul_(w)
    keep = (w != 0).to(_SAME_WIDTH_INT[dst.element_size()]).neg_()  # -1: every bit set
    dst.view(keep.dtype).bitwise_and_(keep)
    return dst


def accumulate_into(
    acc: torch.Tensor, outputs: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """`acc += mask_zero_weight(outputs, weights).sum(0)`, one shard of dim 0 at a time.

    `acc` is the compute-dtype accumulator `[B, h, D]`; `outputs` `[W, B, h, D]` in any dtype.
    Each shard is upcast into one scratch block, its entries whose weight is not positive set
    to exactly +0 by a broadcast integer AND (0 * NaN would be NaN), then multiplied and added
    in one `addcmul_`. A select against a broadcast boolean mask per shard costs more than all
    the rest; the AND is as cheap as a copy. Bit for bit the same as selecting the shard."""
    scratch = torch.empty_like(acc)
    ints = _SAME_WIDTH_INT[scratch.element_size()]
    keep = (weights > 0).unsqueeze(-1).to(ints).neg_()  # -1: every bit set
    for shard, weight, bits in zip(outputs, weights.unsqueeze(-1), keep, strict=True):
        scratch.copy_(shard)
        scratch.view(ints).bitwise_and_(bits)
        acc.addcmul_(scratch, weight)
    return acc


# One group of shards: its outputs, its fp32 staging, (shard, weight)s.
_Group = tuple[torch.Tensor, torch.Tensor, tuple[tuple[torch.Tensor, ...], ...]]


def same_width_int(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype as wide as `dtype`: a mask of it ANDed with a value's bits."""
    return _SAME_WIDTH_INT[dtype.itemsize]


class StagedAccumulation:
    """`accumulate_into` on fixed buffers, for a hot path that runs it every step at one shape.

    At small batches a call's cost is per-op overhead, not data: here every view (each shard,
    each weight column, each group's staging) is made once, at construction. The mask is one
    integer AND over all the outputs, in place and in their own width (half the bytes of
    masking the fp32 staging, for 16-bit outputs), then `group` shards at a time are upcast by
    one copy; so a call is about `W + ceil(W / group) + 4` tensor ops and no Python iteration
    over tensors. Bit for bit `accumulate_into` on a zeroed `acc`: a masked entry is +0 before
    the upcast or after it alike, then the same `addcmul_` per shard in the same order on the
    same values.

    `acc` `[B, h, D]` (compute dtype) is overwritten by each call; `outputs` `[W, B, h, D]` is
    read at call time, and its entries of weight 0 are set to +0 there (it is the caller's
    staging); `weights` `[W, B, h]` (compute dtype) and `keep` `[W, B, h]`
    (`same_width_int` of the outputs' dtype) hold the call's weights and mask; `scratch` is
    flat, compute dtype, at least `min(group, W) * acc.numel()` long."""

    def __init__(
        self,
        acc: torch.Tensor,
        outputs: torch.Tensor,
        *,
        weights: torch.Tensor,
        keep: torch.Tensor,
        scratch: torch.Tensor,
        group: int,
    ) -> None:
        if keep.dtype != same_width_int(outputs.dtype):
            raise ValueError(f"keep must be {same_width_int(outputs.dtype)}, got {keep.dtype}")
        world = outputs.shape[0]
        self.acc, self.weights, self.keep = acc, weights, keep
        self._output_bits, self._keep_bits = outputs.view(keep.dtype), keep.unsqueeze(-1)
        columns = weights.unsqueeze(-1)
        self._groups: list[_Group] = []
        for lo in range(0, world, group):
            hi = min(lo + group, world)
            block = scratch[: (hi - lo) * acc.numel()].view(hi - lo, *acc.shape)
            terms = tuple(zip(block.unbind(0), columns[lo:hi].unbind(0), strict=True))
            self._groups.append((outputs[lo:hi], block, terms))

    def __call__(self, weights: torch.Tensor) -> torch.Tensor:
        """`acc` = the masked weighted sum over dim 0 of `outputs` with these `[W, B, h]`."""
        self.weights.copy_(weights)
        return self.accumulate()

    def accumulate(self) -> torch.Tensor:
        """`acc` = the same sum with the weights already in `weights` (written there by the
        caller's weights step, which saves the copy)."""
        torch.gt(self.weights, 0, out=self.keep).neg_()  # -1: every bit set
        self._output_bits.bitwise_and_(self._keep_bits)
        acc = self.acc.zero_()
        for shards, block, terms in self._groups:
            block.copy_(shards)
            for shard, weight in terms:
                acc.addcmul_(shard, weight)
        return acc


def all_empty_guard(weights: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """Weights 0 where every shard is empty (total = -inf; exp(-inf - -inf) would be NaN)."""
    return torch.where(torch.isfinite(total), weights, 0.0)


@dataclass(frozen=True)
class CombineWeights:
    """Per-rank weights `[W, ...]` (sum 1, or all 0 when every shard is empty) and merged LSE."""

    weights: torch.Tensor
    lse: torch.Tensor


def combine_weights(lses: torch.Tensor, *, base_e: bool = True) -> CombineWeights:
    """Weights of the W partials stacked on dim 0; `base_e=False` for log2 LSEs (exp2/log2)."""
    exp, log = (torch.exp, torch.log) if base_e else (torch.exp2, torch.log2)
    lse = sanitize_lse(lses.to(compute_dtype(lses)))
    m = reference_max(lse)
    shifted = exp(lse - m)
    norm = shifted.sum(dim=0)
    total = m + log(norm)  # -inf exactly where every shard is empty
    # exp(l_n - L) == exp(l_n - m) / sum: the same weight, without rounding L (which is as large
    # as the LSEs) before the subtraction; at |LSE| ~ 5000 that rounding alone costs 5e-4.
    return CombineWeights(weights=all_empty_guard(shifted / norm, total), lse=total)


def combine_local(
    outputs: torch.Tensor,
    lses: torch.Tensor,
    *,
    base_e: bool = True,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Combine partials already sliced to one rank's heads: `[W, B, h, D]` + `[W, B, h]`.

    Returns `[B, h, D]` in `out_dtype` (default: the outputs' dtype), written into `out` if given.
    """
    if outputs.dim() != 4 or lses.shape != outputs.shape[:-1]:
        raise ValueError(
            f"combine_local expects outputs [W, B, h, D] and lses [W, B, h], got "
            f"{tuple(outputs.shape)} and {tuple(lses.shape)}"
        )
    acc = compute_dtype(outputs, lses)
    weights = combine_weights(lses, base_e=base_e).weights.to(acc)
    result = mask_zero_weight(outputs.to(acc), weights).sum(dim=0)
    if out is not None:
        out.copy_(result)
        return out
    return result.to(out_dtype or outputs.dtype)


def lse_combine(
    partial_outputs: torch.Tensor,
    partial_lses: torch.Tensor,
    rank: int,
    *,
    base_e: bool = True,
) -> torch.Tensor:
    """The reference reduction: `[W, B, H, D]` + `[W, B, H]` -> rank's heads `[B, H/W, D]`.

    Rank r receives heads `[r*H/W, (r+1)*H/W)`, the order of `reduce_outputs` and of b12x's
    `lse_reduce_scatter_reference` (same signature, `base_e` for `is_lse_base_on_e`).
    """
    if partial_outputs.dim() != 4:
        raise ValueError(
            f"partial_outputs must be [W, B, H, D], got shape {tuple(partial_outputs.shape)}"
        )
    if partial_lses.shape != partial_outputs.shape[:-1]:
        raise ValueError(
            f"partial_lses must be [W, B, H] = {tuple(partial_outputs.shape[:-1])}, "
            f"got {tuple(partial_lses.shape)}"
        )
    if not partial_lses.is_floating_point() or partial_lses.element_size() < 4:
        raise ValueError(f"partial_lses must be fp32 or fp64, got {partial_lses.dtype}")
    world, _, heads, _ = partial_outputs.shape
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside the world of {world} partials")
    if heads % world:
        raise ValueError(f"{heads} heads cannot be split over {world} ranks")
    h = heads // world
    own = slice(rank * h, (rank + 1) * h)
    return combine_local(partial_outputs[:, :, own], partial_lses[:, :, own], base_e=base_e)
