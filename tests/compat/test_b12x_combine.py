"""Our `lse_combine` against b12x 1.5.1's `lse_reduce_scatter_reference`, the peer's own oracle.

Where the two definitions agree: every shard whose LSE is NaN, +inf or -inf counts as empty
(b12x zeroes its output, ours gives it weight 0), an all-empty head gives 0, and a valid shard
whose weight underflows to 0 contributes 0 as long as its output is finite. The inputs below stay
in that domain: garbage (NaN, inf) outputs only on invalid shards.

Where ours is stricter: a *valid* shard whose weight underflows to exactly 0 contributes exactly
0 in ours even if its output holds NaN or inf; b12x computes `0 * NaN` there and returns NaN
(the combine's definition: such a shard adds exactly 0). That case is pinned below as a
known difference, so a change on either side shows up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch

pcie = pytest.importorskip(
    "b12x.comm.pcie.pcie_dcp_a2a",
    reason="b12x is not installed (nox -s compat installs b12x==1.5.1)",
    exc_type=ModuleNotFoundError,
)

from harness.transport import combine  # noqa: E402
from harness.transport.combine import lse_combine  # noqa: E402
from harness.transport.reference import reference_combine  # noqa: E402

pytestmark = pytest.mark.compat

Combine = Callable[..., torch.Tensor]  # (outputs, lses, rank, *, base_e) -> [B, H/W, D]
WORLD_SIZES = (2, 4, 8, 16)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BASES = {"base_e": True, "base_2": False}


@dataclass(frozen=True)
class Case:
    name: str
    outputs: torch.Tensor  # [W, B, H, D]
    lses: torch.Tensor  # fp32 [W, B, H]


def cases(world: int, dtype: torch.dtype, *, seed: int = 0) -> Iterator[Case]:
    """Random and adversarial partials for `world` ranks, 2 heads per rank, 8-wide heads."""
    gen = torch.Generator().manual_seed(seed * 1000 + world)
    batch, heads, dim = 4, 2 * world, 8
    shape = (world, batch, heads)

    def normal(*size: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(size, generator=gen) * scale

    def with_outputs(name: str, lses: torch.Tensor) -> Case:
        outputs = normal(*shape, dim)
        invalid = ~torch.isfinite(lses)  # garbage only where both sides ignore the shard
        garbage = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e38])
        picks = garbage[torch.randint(0, 4, (*shape, dim), generator=gen)]
        outputs = torch.where(invalid.unsqueeze(-1), picks, outputs)
        return Case(name, outputs.to(dtype), lses.float())

    # adversarial first (the mutation tests stop at the first disagreement)
    # empty and invalid shards: -inf, NaN, +inf at random places, and whole heads empty
    lses = normal(*shape, scale=4.0)
    kind = torch.randint(0, 6, shape, generator=gen)
    lses = torch.where(kind == 0, -float("inf"), lses)
    lses = torch.where(kind == 1, float("nan"), lses)
    lses = torch.where(kind == 2, float("inf"), lses)
    lses[:, 0, 0] = -float("inf")
    lses[:, 1, 1] = float("nan")
    lses[:, 2, :] = (
        torch.tensor([float("nan"), float("inf"), -float("inf")])
        .repeat(world)[:world]
        .unsqueeze(-1)
    )
    yield with_outputs("invalid-shards", lses)
    # a per-token offset far from 0: exp(l) alone overflows (5000) or underflows (-5000)
    offsets = torch.tensor([0.0, 80.0, 5000.0, -5000.0]).view(1, batch, 1)
    yield with_outputs("large-offsets", normal(*shape, scale=4.0) + offsets)
    only = torch.full(shape, -float("inf"))
    only[world - 1] = normal(batch, heads, scale=4.0)
    yield with_outputs("one-valid-shard", only)
    yield with_outputs("random", normal(*shape, scale=4.0))
    # weights spanning 1 to 0 (underflow of valid shards with finite outputs)
    yield with_outputs("wide-spread", normal(*shape, scale=60.0))
    yield with_outputs("ties", torch.full(shape, 7.25))
    dominant = torch.full(shape, -30.0)
    dominant[world // 2] = 0.0
    yield with_outputs("one-dominant", dominant)


def tolerance(dtype: torch.dtype, outputs: torch.Tensor) -> dict[str, float]:
    """Both sides compute the same formula in fp32; allow op-order rounding (fp32) or one
    rounding step of the final cast (bf16), scaled by the largest finite output."""
    finite = outputs.float()[torch.isfinite(outputs.float()) & (outputs.float().abs() < 1e30)]
    scale = float(finite.abs().max()) if finite.numel() else 1.0
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-6 * scale}
    return {"rtol": 2**-7, "atol": 2**-8 * scale}


def difference(mine: torch.Tensor, theirs: torch.Tensor, rtol: float, atol: float) -> str | None:
    """None if equal within tolerance (NaN == NaN, inf == inf), else where and by how much."""
    if (mine.dtype, mine.shape) != (theirs.dtype, theirs.shape):
        return (
            f"ours is {mine.dtype} {tuple(mine.shape)}, b12x {theirs.dtype} {tuple(theirs.shape)}"
        )
    a, b = mine.float(), theirs.float()
    close = torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        return None
    at = tuple((~close).nonzero()[0].tolist())
    return (
        f"{int((~close).sum())}/{close.numel()} elements differ, first at {at}: "
        f"ours {a[at].item()} vs b12x {b[at].item()}"
    )


def disagreements(
    ours: Combine, world: int, dtype: torch.dtype, base_e: bool, *, first_only: bool = False
) -> list[str]:
    """Every (case, destination rank) where `ours` differs from b12x's reference."""
    found = []
    for case in cases(world, dtype):
        for rank in range(world):
            theirs = pcie.lse_reduce_scatter_reference(
                case.outputs, case.lses, rank, is_lse_base_on_e=base_e
            )
            mine = ours(case.outputs, case.lses, rank, base_e=base_e)
            problem = difference(mine, theirs, **tolerance(dtype, case.outputs))
            if problem is not None:
                found.append(f"{case.name} W={world} rank={rank}: {problem}")
                if first_only:
                    return found
    return found


CONFIGS = [
    pytest.param(world, dtype, base_e, id=f"W{world}-{dname}-{bname}")
    for world in WORLD_SIZES
    for dname, dtype in DTYPES.items()
    for bname, base_e in BASES.items()
]


@pytest.mark.parametrize("world, dtype, base_e", CONFIGS)
def test_lse_combine_equals_b12x_reference_on_every_rank(world, dtype, base_e):
    problems = disagreements(lse_combine, world, dtype, base_e)
    assert not problems, "\n".join(problems)


def float64_reference(outputs: torch.Tensor, lses: torch.Tensor, rank: int, *, base_e: bool):
    """The suites' independent float64 reference, cast to the outputs' dtype like b12x's."""
    return reference_combine(outputs, lses, rank, base_e=base_e).to(outputs.dtype)


@pytest.mark.parametrize("world, dtype, base_e", CONFIGS)
def test_the_float64_reference_equals_b12x_reference_on_every_rank(world, dtype, base_e):
    problems = disagreements(float64_reference, world, dtype, base_e)
    assert not problems, "\n".join(problems)


def scaled_and_summed(outputs: torch.Tensor, lses: torch.Tensor, rank: int, *, base_e: bool):
    """The AG+RS transport's local math: its in-place scaling step on every partial's copy of
    this rank's heads, then the sum its reduce-scatter does, cast once at the end."""
    h = outputs.shape[2] // outputs.shape[0]
    own = slice(rank * h, (rank + 1) * h)
    block = outputs[:, :, own]
    weights = combine.combine_weights(lses[:, :, own], base_e=base_e).weights
    scaled = combine.scale_into(torch.empty(block.shape, dtype=weights.dtype), block, weights)
    return scaled.sum(dim=0).to(outputs.dtype)


def accumulated(outputs: torch.Tensor, lses: torch.Tensor, rank: int, *, base_e: bool):
    """The A2A transport's local math on the chunks it received: the accumulation step."""
    h = outputs.shape[2] // outputs.shape[0]
    own = slice(rank * h, (rank + 1) * h)
    block = outputs[:, :, own]
    weights = combine.combine_weights(lses[:, :, own], base_e=base_e).weights
    acc = torch.zeros(block.shape[1:], dtype=weights.dtype)
    return combine.accumulate_into(acc, block, weights).to(outputs.dtype)


@pytest.mark.parametrize("step", [scaled_and_summed, accumulated], ids=["ag_rs", "a2a"])
@pytest.mark.parametrize("world, dtype, base_e", CONFIGS)
def test_the_transports_local_steps_equal_b12x_reference_on_every_rank(step, world, dtype, base_e):
    problems = disagreements(step, world, dtype, base_e)
    assert not problems, "\n".join(problems)


def test_the_adversarial_inputs_reach_the_edge_cases():
    """The cases hold what the mutation tests rely on: invalid LSEs with garbage outputs,
    all-empty heads, LSEs where exp() overflows, and valid weights that underflow to 0."""
    by_name = {c.name: c for c in cases(4, torch.float32)}
    invalid = by_name["invalid-shards"]
    assert torch.isnan(invalid.lses).any() and torch.isposinf(invalid.lses).any()
    assert torch.isneginf(invalid.lses).any()
    assert (~torch.isfinite(invalid.lses)).all(dim=0).any(), "an all-empty head"
    assert torch.isnan(invalid.outputs).any()
    assert torch.isinf(torch.exp(by_name["large-offsets"].lses)).any()
    spread = by_name["wide-spread"].lses
    shifted = torch.exp(spread - spread.amax(dim=0))
    assert (shifted == 0).any(), "a valid shard whose weight underflows"


def test_where_ours_is_stricter_a_valid_zero_weight_shard_with_nan_output():
    outputs = torch.tensor([1.0, float("nan")]).view(2, 1, 1, 1).repeat(1, 1, 2, 1)
    lses = torch.tensor([0.0, -200.0]).view(2, 1, 1).repeat(1, 1, 2)  # exp(-200) == 0 in fp32
    theirs = pcie.lse_reduce_scatter_reference(outputs, lses, 0)
    ours = lse_combine(outputs, lses, 0)
    assert torch.isnan(theirs).all(), "b12x: 0 * NaN"
    assert ours.tolist() == [[[1.0]]], "ours: a zero weight contributes exactly zero"
    # In float64 exp(-200) is still positive (the NaN counts); 2000 below underflows there too.
    assert torch.isnan(reference_combine(outputs, lses, 0)).all(), "float64: a live weight"
    deeper = torch.tensor([0.0, -2000.0]).view(2, 1, 1).repeat(1, 1, 2)
    assert reference_combine(outputs, deeper, 0).tolist() == [[[1.0]]], "float64 underflow"


# -- the comparison can fail: break one term of our combine and it is caught -------------------


def always_exp(outputs: torch.Tensor, lses: torch.Tensor, rank: int, *, base_e: bool):
    """exp/log where the LSEs are base 2 (base_e ignored)."""
    return lse_combine(outputs, lses, rank, base_e=True)


MUTANTS: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]] | None] = {
    "no-max-subtraction": ("reference_max", lambda lse: torch.zeros_like(lse[0])),
    "no-sanitize": ("sanitize_lse", lambda lse: lse),
    "no-zero-weight-mask": (
        "mask_zero_weight",
        lambda outputs, weights: outputs * weights.unsqueeze(-1),
    ),
    "exp-for-exp2": None,  # a different combine function rather than a patched term
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_breaking_one_term_of_the_combine_is_detected(mutant, monkeypatch):
    patch = MUTANTS[mutant]
    ours: Combine = lse_combine
    if patch is None:
        ours = always_exp
    else:
        name, broken = patch
        assert hasattr(combine, name), f"harness.transport.combine.{name} is gone; update MUTANTS"
        monkeypatch.setattr(combine, name, broken)
    for world in WORLD_SIZES:
        for dtype in DTYPES.values():
            for base_e in (True, False) if patch is not None else (False,):
                assert disagreements(ours, world, dtype, base_e, first_only=True), (
                    f"{mutant} not detected at W={world} {dtype} base_e={base_e}"
                )
