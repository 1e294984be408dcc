"""Deterministic transport inputs, shared by the unit tests and the multi-rank suite.

Every rank builds the *whole* world's inputs from the same seed, feeds its own slice to the
transport, and checks its result against the oracle on the whole. Inputs encode where they come
from, so a misrouted slice cannot pass: channel 0 holds the source rank + 1, channel 1 the head
+ 1 (global head for queries), channel 2 the token + 1 (small integers, exact in bf16); the
rest is seeded noise.

LSE patterns (the empty and degenerate shards of `harness.transport.reference`), per
(token, head):
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

import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from harness.core.signature import TransportSignature
from harness.transport.reference import reference_combine_heads, reference_gather
from harness.transport.registry import TransportRegistry, created_on
from harness.warm.protocols import DCPTransport

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
    """A world's partial outputs `[W, B, H, D]` and fp32 LSEs `[W, B, H]`, from one seed.

    The LSEs (small) are held whole; outputs are built per (source rank, head block of H/W
    heads) from their own seed, so a rank of a 16-rank job builds only the 2W blocks it needs
    (its own partial, and every rank's partial for its heads) instead of all W^2, and each of
    them once however often a test asks (its partial per reduction, its oracle per LSE base);
    the oracle's result too, per rank and base.
    """

    world: int
    batch: int
    total_heads: int
    odim: int
    dtype: torch.dtype
    pattern: str
    seed: int
    lses: torch.Tensor
    garbage: torch.Tensor
    flip: torch.Tensor
    _blocks: dict[tuple[int, int], torch.Tensor] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _expected: dict[tuple[int, bool], torch.Tensor] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def local_heads(self) -> int:
        return self.total_heads // self.world

    def block(self, src: int, index: int) -> torch.Tensor:
        """Rank `src`'s partial output for head block `index`: `[B, H/W, D]` (a new tensor)."""
        return self._block(src, index).clone()

    def _block(self, src: int, index: int) -> torch.Tensor:
        """`block`, built on first use and kept (callers only read it: `cat`, `stack`)."""
        key = (src, index)
        if key not in self._blocks:
            self._blocks[key] = self._build_block(src, index)
        return self._blocks[key]

    def _build_block(self, src: int, index: int) -> torch.Tensor:
        h, b = self.local_heads, self.batch
        heads = slice(index * h, (index + 1) * h)
        gen = torch.Generator().manual_seed(_block_seed(self.seed, src, index))
        out = torch.randn(b, h, self.odim, generator=gen)
        shape = (b, h)
        _encode(
            out,
            torch.full(shape, float(src)),
            torch.arange(heads.start, heads.stop).float().expand(shape),
            torch.arange(b).float().view(b, 1).expand(shape),
        )
        garbage = self.garbage[src, :, heads].unsqueeze(-1)
        junk = torch.where(self.flip[src, :, heads], NAN, 1e30).unsqueeze(-1)
        return torch.where(garbage, junk, out).to(self.dtype)

    def of_rank(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What rank `rank` hands to `reduce_outputs`: `[B, H, D]` and `[B, H]`."""
        blocks = [self._block(rank, j) for j in range(self.world)]
        return torch.cat(blocks, dim=1), self.lses[rank].clone()

    def head_block(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's partials for rank `rank`'s heads: `[W, B, h, D]` and `[W, B, h]`."""
        h = self.local_heads
        outputs = torch.stack([self._block(src, rank) for src in range(self.world)])
        return outputs, self.lses[:, :, rank * h : (rank + 1) * h].clone()

    @property
    def outputs(self) -> torch.Tensor:
        """The whole `[W, B, H, D]` (W^2 blocks: for unit tests and small worlds)."""
        return torch.stack([self.of_rank(r)[0] for r in range(self.world)])

    def expected(self, rank: int, *, base_e: bool = True) -> torch.Tensor:
        """The oracle for rank `rank`: the independent float64 reference on its head block
        (`harness.transport.reference`, no code shared with the transports), in `dtype`; computed
        once per (rank, base) however often asked (a new tensor each time)."""
        key = (rank, base_e)
        if key not in self._expected:
            combined = reference_combine_heads(*self.head_block(rank), base_e=base_e)
            self._expected[key] = combined.to(self.dtype)
        return self._expected[key].clone()


def _block_seed(seed: int, src: int, index: int) -> int:
    return zlib.crc32(f"{seed}/{src}/{index}".encode())


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
    """`[W, B, h, q]` -> the gathered `[B, W*h, q]` every rank must see (rank-major heads),
    from the independent reference (a head-by-head copy, not the transport's reshape)."""
    return reference_gather(queries)


def _lse_for(
    pattern: str, world: int, shape: tuple[int, ...], gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
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
    if total_heads % world:
        raise ValueError(f"{total_heads} heads cannot be split over {world} ranks")
    gen = torch.Generator().manual_seed(seed)
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
    return Partials(
        world=world,
        batch=batch,
        total_heads=total_heads,
        odim=odim,
        dtype=dtype,
        pattern=pattern,
        seed=seed,
        lses=lse.to(torch.float32),
        garbage=garbage,
        flip=flip,
    )


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


# -- suite geometries -------------------------------------------------------------------------

# (strategy, reduce_scatter implementation) per name; "ag_rs_a2a" is AG+RS with the all-to-all
# reduce-scatter equivalent used where a process group has no native reduce-scatter.
IMPLS: dict[str, tuple[str, str]] = {
    "ag_rs": ("ag_rs", "native"),
    "ag_rs_a2a": ("ag_rs", "all_to_all"),
    "a2a": ("a2a", "native"),
}
DCP_SIZES: tuple[int, ...] = (2, 4, 16)
SUITE_MAX_TOKENS = 4


@dataclass(frozen=True)
class ModelGeometry:
    """Per-rank heads at TP16 and head widths; gathered heads = local_heads * dcp."""

    name: str
    local_heads: int
    query_head_dim: int
    output_head_dim: int

    def signature(
        self, dtype: str, dcp: int, device_type: str = "cpu", max_tokens: int = SUITE_MAX_TOKENS
    ) -> TransportSignature:
        return TransportSignature(
            dtype=dtype,
            total_heads=self.local_heads * dcp,
            query_head_dim=self.query_head_dim,
            output_head_dim=self.output_head_dim,
            dcp_world_size=dcp,
            max_tokens=max_tokens,
            device_type=device_type,
        )


MODELS: dict[str, ModelGeometry] = {
    # Kimi-K3 TP16: 96 heads / 16 = 6 per rank; 576-wide queries, 512-wide outputs.
    "kimi-k3": ModelGeometry("kimi-k3", 6, 576, 512),
    # DeepSeek-V4 B12X attention TP16: 128 heads / 16 = 8 per rank; 512 both ways.
    "deepseek-v4": ModelGeometry("deepseek-v4", 8, 512, 512),
}


# -- suite helpers ----------------------------------------------------------------------------


@dataclass
class SuiteTransports:
    """One transport per (implementation, signature) for a whole session of the suite: created
    on its first request with the registry's collective `get_or_create` (its agreement and its
    creation collectives), fetched with the local `get` on every later request.

    Every rank of a group runs the same cases in the same order, so every rank makes its first
    request for a transport in the same case; the agreement on a hit is what lets production
    code ask again safely, and the registry's own suite and unit tests keep it pinned. A request
    is remembered before its collective, so a creation that failed on some ranks is never
    retried by those ranks alone: a later request finds no transport on them and fails there,
    without entering a collective its peers are not in.
    """

    registries: Mapping[str, TransportRegistry]
    _asked: set[tuple[str, TransportSignature]] = field(default_factory=set, init=False)

    def get(
        self, impl: str, signature: TransportSignature, group: dist.ProcessGroup
    ) -> DCPTransport:
        registry = self.registries[impl]
        key = (impl, signature)
        if key not in self._asked:
            self._asked.add(key)
            return registry.get_or_create(signature, group)
        transport = registry.get(signature)
        if transport is None:
            raise AssertionError(
                f"{impl} transport [{signature.describe()}] is missing on this rank: "
                "its creation failed in an earlier case"
            )
        if not created_on(transport, group):
            raise AssertionError(
                f"{impl} transport [{signature.describe()}] was created on another process group"
            )
        return transport


@dataclass
class Variants:
    """The checks of one case over variants that differ only in data (LSE patterns, bases):
    every variant is checked, and the case fails once, at the end, naming every variant that
    failed with its message, so grouping them in one case hides no failure.

    Only the checks go inside `check`, never a collective: an `AssertionError` from a check
    is kept and the next variant runs, which is safe because every rank finished the
    variant's collectives; anything else propagates at once."""

    failed: list[str] = field(default_factory=list)
    checked: int = 0

    @contextmanager
    def check(self, name: str) -> Iterator[None]:
        self.checked += 1
        try:
            yield
        except AssertionError as error:
            self.failed.append(f"{name}: {error}")

    def assert_all_passed(self) -> None:
        if self.failed:
            raise AssertionError(
                f"{len(self.failed)} of {self.checked} variants failed:\n" + "\n".join(self.failed)
            )
