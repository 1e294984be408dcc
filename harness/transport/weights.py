"""The transports' combine weights: the oracle's weights, bit for bit, on static buffers.

The oracle (`harness.transport.combine.combine_weights`) is written to be read: about fifteen
small ops, each allocating its result, and the merged LSE as well. A transport computes the
weights on every step at one shape, and at decode batches a step costs per-op overhead, not
data; so the transports compute them here, in eight ops into fixed buffers, sharing no code with
the oracle that checks them. Each step, and why it gives the oracle's bits:

- `sanitize_into`: `nan_to_num(nan=-inf, posinf=-inf, neginf=-inf)` is the oracle's
  `where(isnan | isposinf, -inf, l)`: every other value (-0 and denormals included) is copied.
  It writes a contiguous buffer, so every later op runs on the oracle's shapes and layouts.
- `shift_by_max`: m = the max over ranks, then `nan_to_num(m, 0, 0, 0)`, which is the oracle's
  `where(isfinite(m), m, 0)`; then l - m and exp (exp2 for base 2), in place. The same ops on
  same-shaped contiguous tensors as the oracle's: a vectorized exp may round a lane apart from
  the scalar tail, so the elements must fall in the same lanes, and they do.
- `normalize_into`: norm = the sum over ranks. The oracle zeroes the weights where
  m + log(norm) is not finite; with m finite and 0 <= log(norm) <= log(W) that is exactly where
  norm == 0, i.e. where every shard is empty and every shifted value is +0. Elsewhere norm >= 1:
  the max's own term is exp(0) = 1 and the others are >= 0. So `clamp_min(norm, 1)` changes only
  the empty rows, and shifted / 1 there is +0, the oracle's 0. The division is only for the rows
  the caller wants (one rank's, for AG+RS), and writes where the weights are used.

None reads a value back to the host, so all stay legal inside a CUDA graph. The LSEs are fp32
(the transports' contract), and so are the buffers.
"""

from __future__ import annotations

import math

import torch

__all__ = ["StagedWeights", "normalize_into", "sanitize_into", "shift_by_max"]


def sanitize_into(work: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """`work` = the LSEs with NaN and +inf as -inf (an empty shard); any strides on `lses`."""
    return torch.nan_to_num(lses, nan=-math.inf, posinf=-math.inf, neginf=-math.inf, out=work)


def shift_by_max(work: torch.Tensor, peak: torch.Tensor, base_e: bool) -> torch.Tensor:
    """`work` = exp(l - m) in place, m the max over dim 0 (0 where every shard is empty)."""
    torch.amax(work, dim=0, out=peak)
    peak.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    work.sub_(peak)
    return work.exp_() if base_e else work.exp2_()


def normalize_into(
    out: torch.Tensor, numerators: torch.Tensor, shifted: torch.Tensor, norm: torch.Tensor
) -> torch.Tensor:
    """`out` = numerators / (sum over dim 0 of `shifted`), +0 where that sum is 0.

    `numerators` is `shifted` or rows of it; the sum is 0 or at least 1 (see the module doc)."""
    torch.sum(shifted, dim=0, out=norm)
    norm.clamp_min_(1.0)
    return torch.div(numerators, norm, out=out)


class StagedWeights:
    """The combine weights of `[W, B, H]` LSEs into `out`, on buffers made once for one shape.

    `work` `[W, B, H]`, `peak` and `norm` `[B, H]` are scratch (fp32); `out` is `[W, B, H]`, or
    `[B, H]` with `row` set: then only rank `row`'s weights are written (AG+RS scales by its
    own). A call overwrites all four and returns `out`."""

    def __init__(
        self,
        *,
        work: torch.Tensor,
        peak: torch.Tensor,
        norm: torch.Tensor,
        out: torch.Tensor,
        row: int | None = None,
    ) -> None:
        self.work, self.peak, self.norm, self.out = work, peak, norm, out
        self._numerators = work if row is None else work[row]
        if self._numerators.shape != out.shape:
            raise ValueError(
                f"weights out {tuple(out.shape)} does not match {tuple(self._numerators.shape)}"
            )

    def __call__(self, lses: torch.Tensor, *, base_e: bool = True) -> torch.Tensor:
        """`out` = `combine_weights(lses, base_e=base_e).weights` (or its row), bit for bit."""
        shift_by_max(sanitize_into(self.work, lses), self.peak, base_e)
        return normalize_into(self.out, self._numerators, self.work, self.norm)
