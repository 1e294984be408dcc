"""An independent float64 reference for the DCP query gather and the LSE combine.

Written from the definitions below alone, in numpy, so that it shares no code and no formulas
with what it checks: `combine` (the torch oracle and the transports' in-place steps) computes
the weights as `exp(l_n - m) / sum_n exp(l_n - m)` in fp32 with named masking helpers; this
module computes the merged LSE `L = m + log sum_n exp(l_n - m)` first and then the textbook
weight `exp(l_n - L)`, in float64, with its own masks. A bug in one of the two shows up as a
disagreement instead of agreeing with itself.

The definitions:
- an LSE that is NaN or +inf counts as -inf (an empty shard);
- `m = max_n l_n`, and 0 where every shard is empty;
- `L = m + log sum_n exp(l_n - m)` (-inf where every shard is empty);
- `O = sum_n w_n O_n` with `w_n = exp(l_n - L)`, where a shard whose weight is not positive
  (empty, underflowed, or every shard empty) adds exactly 0, whatever its output holds.

Base 2 (`base_e=False`) uses exp2/log2. Rank r of W receives heads `[r*H/W, (r+1)*H/W)`.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "reference_combine",
    "reference_combine_heads",
    "reference_gather",
    "reference_merged_lse",
]


def _float64(tensor: torch.Tensor) -> np.ndarray:
    """A float64 numpy copy (bf16 has no numpy dtype, so the upcast happens in torch)."""
    return tensor.detach().to(device="cpu", dtype=torch.float64).numpy().copy()


def _own_heads(heads: int, world: int, rank: int) -> slice:
    if world < 1 or heads % world:
        raise ValueError(f"{heads} heads cannot be split over {world} ranks")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside the world of {world}")
    per_rank = heads // world
    return slice(rank * per_rank, (rank + 1) * per_rank)


def _empty_as_neg_inf(lses: np.ndarray) -> np.ndarray:
    out = lses.copy()
    out[np.isnan(out) | (out == np.inf)] = -np.inf
    return out


def _merged(lses: np.ndarray, base_e: bool) -> np.ndarray:
    """L over dim 0 of already-emptied LSEs; -inf where every shard is empty."""
    exp, log = (np.exp, np.log) if base_e else (np.exp2, np.log2)
    top = lses.max(axis=0)
    top = np.where(top == -np.inf, 0.0, top)
    with np.errstate(divide="ignore"):  # log(0) = -inf is the all-empty case
        merged: np.ndarray = top + log(exp(lses - top).sum(axis=0))
    return merged


def reference_merged_lse(lses: torch.Tensor, *, base_e: bool = True) -> torch.Tensor:
    """The merged LSE `L` of `[W, ...]` LSEs, float64 `[...]` (-inf where all are empty)."""
    return torch.from_numpy(_merged(_empty_as_neg_inf(_float64(lses)), base_e))


def reference_combine_heads(
    outputs: torch.Tensor, lses: torch.Tensor, *, base_e: bool = True
) -> torch.Tensor:
    """Combine every head of `[W, B, h, D]` + `[W, B, h]` partials: float64 `[B, h, D]`."""
    if outputs.dim() != 4 or tuple(lses.shape) != tuple(outputs.shape[:-1]):
        raise ValueError(
            f"expected outputs [W, B, h, D] and lses [W, B, h], got "
            f"{tuple(outputs.shape)} and {tuple(lses.shape)}"
        )
    values = _float64(outputs)
    emptied = _empty_as_neg_inf(_float64(lses))
    merged = _merged(emptied, base_e)
    exp = np.exp if base_e else np.exp2
    with np.errstate(invalid="ignore"):  # -inf - -inf = NaN where every shard is empty
        weights = exp(emptied - merged)
    counts = weights > 0  # False for 0 and for NaN
    weights = np.where(counts, weights, 0.0)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        terms = np.where(counts[..., None], weights * values, 0.0)
    return torch.from_numpy(terms.sum(axis=0))


def reference_combine(
    partial_outputs: torch.Tensor,
    partial_lses: torch.Tensor,
    rank: int,
    *,
    base_e: bool = True,
) -> torch.Tensor:
    """`[W, B, H, D]` + `[W, B, H]` -> rank's combined heads, float64 `[B, H/W, D]`."""
    if partial_outputs.dim() != 4:
        raise ValueError(f"expected outputs [W, B, H, D], got {tuple(partial_outputs.shape)}")
    world, _, heads, _ = partial_outputs.shape
    own = _own_heads(heads, world, rank)
    return reference_combine_heads(
        partial_outputs[:, :, own], partial_lses[:, :, own], base_e=base_e
    )


def reference_gather(local_queries: torch.Tensor) -> torch.Tensor:
    """Every rank's local queries `[W, B, h, q]` -> the gathered `[B, W*h, q]`, rank r's heads
    at `[r*h, (r+1)*h)`, in the queries' own dtype (the gather moves bits, computes nothing)."""
    if local_queries.dim() != 4:
        raise ValueError(f"expected queries [W, B, h, q], got {tuple(local_queries.shape)}")
    world, batch, h, q = local_queries.shape
    gathered = torch.empty(batch, world * h, q, dtype=local_queries.dtype)
    for src in range(world):
        for head in range(h):
            gathered[:, src * h + head, :] = local_queries[src, :, head, :]
    return gathered
