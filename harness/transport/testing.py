"""Deterministic transport inputs, shared by the unit tests and the multi-rank suite.

Every rank builds the *whole* world's inputs from the same seed, feeds its own slice to the
transport, and checks its result against the oracle on the whole. Inputs encode where they come
from, so a misrouted slice cannot pass: channel 0 holds the source rank + 1, channel 1 the head
+ 1 (global head for queries), channel 2 the token + 1 (small integers, exact in bf16); the
rest is seeded noise.

LSE patterns (domain.md section 1), per (token, head):
- `random`: N(0, 3^2) on every rank;
- `empty_shards`: some ranks -inf, with NaN outputs;
- `nan_inf`: some ranks NaN or +inf (empty shards too), with NaN / huge garbage outputs;
- `all_empty`: every rank -inf, NaN or +inf: the result must be exactly 0, no NaN;
- `huge_spread`: per-rank offsets of up to +-3000 (only the top survives);
- `huge_offset`: every LSE near 5000 (overflows exp without the max subtraction);
- `one_hot`: one finite rank per entry, the others empty with NaN outputs: the result is that
  rank's output exactly, so a wrong source is caught;
- `underflow_nan_output`: finite LSEs 10^4 below the max with NaN outputs: their weight
  underflows to exactly 0 and they must contribute exactly 0;
- `mixed`: each (token, head) draws one of the above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PATTERNS: tuple[str, ...] = (
    "random",
    "empty_shards",
    "nan_inf",
    "all_empty",
    "huge_spread",
    "huge_offset",
    "one_hot",
    "underflow_nan_output",
    "mixed",
)
ADVERSARIAL: tuple[str, ...] = tuple(p for p in PATTERNS if p not in ("random",))
_SINGLE = PATTERNS[:-1]
NAN = float("nan")
INF = float("inf")


@dataclass(frozen=True)
class Partials:
    """The whole world's partial outputs `[W, B, H, D]` and fp32 LSEs `[W, B, H]`."""

    outputs: torch.Tensor
    lses: torch.Tensor
    pattern: str

    def of_rank(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What rank `rank` hands to `reduce_outputs`: `[B, H, D]` and `[B, H]`."""
        return self.outputs[rank].clone(), self.lses[rank].clone()


def _encode(
    values: torch.Tensor, rank: torch.Tensor, head: torch.Tensor, tok: torch.Tensor
) -> None:
    values[..., 0] = rank + 1
    values[..., 1] = head + 1
    values[..., 2] = tok + 1


def make_queries(
    world: int, batch: int, local_heads: int, qdim: int, dtype: torch.dtype, *, seed: int
) -> torch.Tensor:
    """All ranks' local queries `[W, B, h, qdim]`; `[r]` is what rank r gathers."""
    if qdim < 3:
        raise ValueError(f"query head dim {qdim} is too small to encode rank/head/token")
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(world, batch, local_heads, qdim, generator=gen)
    rank = torch.arange(world).view(world, 1, 1).float()
    head = (torch.arange(world).view(world, 1, 1) * local_heads + torch.arange(local_heads)).float()
    tok = torch.arange(batch).view(1, batch, 1).float()
    _encode(q, rank.expand(world, batch, local_heads), head.expand(world, batch, local_heads), tok)
    return q.to(dtype)


def expected_gather(queries: torch.Tensor) -> torch.Tensor:
    """`[W, B, h, q]` -> the gathered `[B, W*h, q]` every rank must see (rank-major heads)."""
    world, batch, h, q = queries.shape
    return queries.transpose(0, 1).reshape(batch, world * h, q)


def _lse_for(pattern: str, world: int, shape: tuple[int, ...], gen: torch.Generator):
    """(lses [W, *shape], garbage mask [W, *shape]) for one single pattern."""
    lse = torch.randn(world, *shape, generator=gen) * 3
    garbage = torch.zeros(world, *shape, dtype=torch.bool)
    rand = torch.rand(world, *shape, generator=gen)
    if pattern == "empty_shards":
        empty = rand < 0.5
        lse[empty] = -INF
        garbage = empty
    elif pattern == "nan_inf":
        nan, posinf, neginf = rand < 0.25, (rand >= 0.25) & (rand < 0.45), rand >= 0.9
        lse[nan], lse[posinf], lse[neginf] = NAN, INF, -INF
        garbage = nan | posinf | neginf
    elif pattern == "all_empty":
        lse = torch.where(rand < 0.33, NAN, torch.where(rand < 0.66, INF, -INF))
        garbage = torch.ones_like(garbage)
    elif pattern == "huge_spread":
        lse = lse + (rand * 2 - 1) * 3000
    elif pattern == "huge_offset":
        lse = lse + 5000
    elif pattern == "one_hot":
        alive = torch.randint(0, world, shape, generator=gen)
        garbage = torch.arange(world).view(world, *([1] * len(shape))) != alive
        lse[garbage] = -INF
    elif pattern == "underflow_nan_output":
        alive = torch.randint(0, world, shape, generator=gen)
        garbage = torch.arange(world).view(world, *([1] * len(shape))) != alive
        lse[garbage] = lse[garbage] - 1e4
    elif pattern != "random":
        raise ValueError(f"unknown LSE pattern {pattern!r}; expected one of {PATTERNS}")
    return lse, garbage


def make_partials(
    world: int,
    batch: int,
    total_heads: int,
    odim: int,
    dtype: torch.dtype,
    *,
    pattern: str,
    seed: int,
) -> Partials:
    """The whole world's partials for one LSE pattern (see the module doc)."""
    if odim < 3:
        raise ValueError(f"output head dim {odim} is too small to encode rank/head/token")
    gen = torch.Generator().manual_seed(seed)
    out = torch.randn(world, batch, total_heads, odim, generator=gen)
    rank = torch.arange(world).view(world, 1, 1).float().expand(world, batch, total_heads)
    head = torch.arange(total_heads).view(1, 1, total_heads).float().expand_as(rank)
    tok = torch.arange(batch).view(1, batch, 1).float().expand_as(rank)
    _encode(out, rank, head, tok)
    shape = (batch, total_heads)
    if pattern == "mixed":
        choice = torch.randint(0, len(_SINGLE), shape, generator=gen)
        lse = torch.empty(world, *shape)
        garbage = torch.empty(world, *shape, dtype=torch.bool)
        for index, single in enumerate(_SINGLE):
            one_lse, one_garbage = _lse_for(single, world, shape, gen)
            pick = (choice == index).expand(world, *shape)
            lse[pick], garbage[pick] = one_lse[pick], one_garbage[pick]
    else:
        lse, garbage = _lse_for(pattern, world, shape, gen)
    flip = torch.rand(world, *shape, generator=gen) < 0.5
    junk = torch.where(flip, NAN, 1e30).unsqueeze(-1).expand_as(out)
    out = torch.where(garbage.unsqueeze(-1), junk, out)
    return Partials(outputs=out.to(dtype), lses=lse.to(torch.float32), pattern=pattern)


TOLERANCES: dict[torch.dtype, float] = {
    torch.float32: 1e-5,
    torch.float64: 1e-5,
    torch.bfloat16: 2e-2,
    torch.float16: 2e-2,
}


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, *, what: str = "") -> None:
    """Relative match at the dtype's tolerance (fp32 1e-5, 16-bit 2e-2), scaled by max |ref|.

    NaN anywhere in `actual` fails; so does a dtype or shape difference.
    """
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise AssertionError(
            f"{what}: got {actual.dtype}{list(actual.shape)}, "
            f"expected {expected.dtype}{list(expected.shape)}"
        )
    a, e = actual.double(), expected.double()
    if not torch.isfinite(a).all():
        bad = (~torch.isfinite(a)).nonzero()[:4].tolist()
        raise AssertionError(f"{what}: non-finite values at {bad}")
    rtol = TOLERANCES[actual.dtype]
    scale = max(e.abs().max().item() if e.numel() else 0.0, 1.0)
    err = (a - e).abs()
    limit = rtol * torch.maximum(e.abs(), torch.tensor(scale))
    if (err > limit).any():
        worst = int((err - limit).argmax())
        idx = list(torch.unravel_index(torch.tensor(worst), a.shape))
        raise AssertionError(
            f"{what}: max abs error {err.max().item():.3g} (rtol {rtol}, scale {scale:.3g}); "
            f"worst at {[int(i) for i in idx]}: got {a.flatten()[worst].item():.6g}, "
            f"expected {e.flatten()[worst].item():.6g}"
        )


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads included), for the determinism and gather checks."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))
