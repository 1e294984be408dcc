"""Property tests (Hypothesis) for the LSE combine against the independent float64 reference.

Random world sizes, batch, heads and head widths; LSEs drawn per entry from finite values, NaN,
+inf and -inf, shifted by per-case offsets far from 0 (where exp alone overflows or underflows);
garbage outputs (NaN, inf, 3e38) wherever a shard is empty; base e and base 2. The torch oracle
(`lse_combine`), both in-place steps the transports use, and the merged LSE must match
`harness.transport.reference`, which shares no code with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.transport import combine
from harness.transport.combine import lse_combine
from harness.transport.reference import reference_combine, reference_merged_lse
from harness.transport.testing import assert_matches

WORLDS = (1, 2, 3, 4, 8, 16)
OFFSETS = (0.0, 80.0, -80.0, 5000.0, -5000.0, 1e4)
SPECIALS = (math.nan, math.inf, -math.inf)
GARBAGE = (math.nan, math.inf, -math.inf, 3e38)
PROPERTY_SETTINGS = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@dataclass(frozen=True)
class Case:
    outputs: torch.Tensor  # [W, B, H, D]
    lses: torch.Tensor  # fp32 [W, B, H]
    base_e: bool

    @property
    def world(self) -> int:
        return int(self.outputs.shape[0])


@st.composite
def cases(draw: st.DrawFn, dtype: torch.dtype = torch.float32) -> Case:
    world = draw(st.sampled_from(WORLDS))
    batch = draw(st.integers(1, 3))
    local = draw(st.integers(1, 3))
    dim = draw(st.integers(1, 5))
    shape = (world, batch, world * local)
    count = math.prod(shape)
    finite = st.floats(-30.0, 30.0, allow_nan=False, width=32)
    entry = st.one_of(finite, finite, st.sampled_from(SPECIALS))
    values = draw(st.lists(entry, min_size=count, max_size=count))
    offset = draw(st.sampled_from(OFFSETS))
    lses = (torch.tensor(values, dtype=torch.float32) + offset).view(shape)
    if draw(st.booleans()):  # a whole head empty, a shape the per-entry draw rarely makes
        lses[:, 0, 0] = draw(st.sampled_from(SPECIALS))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    outputs = torch.randn(*shape, dim, generator=gen) * 4
    junk = torch.tensor(GARBAGE)[torch.randint(0, len(GARBAGE), (*shape, dim), generator=gen)]
    empty = ~torch.isfinite(lses)
    outputs = torch.where(empty.unsqueeze(-1), junk, outputs).to(dtype)
    return Case(outputs, lses, draw(st.booleans()))


def _each_rank(case: Case, fn) -> None:
    for rank in range(case.world):
        want = reference_combine(case.outputs, case.lses, rank, base_e=case.base_e)
        got = fn(case.outputs, case.lses, rank, base_e=case.base_e)
        assert_matches(got, want.to(got.dtype), what=f"W={case.world} rank {rank}")


@PROPERTY_SETTINGS
@given(cases())
def test_lse_combine_matches_the_reference(case: Case) -> None:
    _each_rank(case, lse_combine)


@PROPERTY_SETTINGS
@given(cases(torch.bfloat16))
def test_lse_combine_matches_the_reference_in_bf16(case: Case) -> None:
    _each_rank(case, lse_combine)


@PROPERTY_SETTINGS
@given(cases(torch.float64))
def test_lse_combine_in_fp64_matches_the_reference_closely(case: Case) -> None:
    lses = case.lses.double()
    for rank in range(case.world):
        got = lse_combine(case.outputs, lses, rank, base_e=case.base_e)
        want = reference_combine(case.outputs, lses, rank, base_e=case.base_e)
        assert got.dtype == torch.float64
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-9 * max(1.0, want.abs().max()))


def _block(case: Case, rank: int):
    h = case.outputs.shape[2] // case.world
    own = slice(rank * h, (rank + 1) * h)
    weights = combine.combine_weights(case.lses[:, :, own], base_e=case.base_e).weights
    return case.outputs[:, :, own], weights


def by_scaling(outputs, lses, rank, *, base_e):
    """The AG+RS transport's rescale into its send buffer, then the reduce-scatter's sum."""
    block, weights = _block(Case(outputs, lses, base_e), rank)
    dst = torch.empty(block.shape, dtype=torch.float32)
    return combine.scale_into(dst, block, weights).sum(dim=0).to(outputs.dtype)


def by_accumulating(outputs, lses, rank, *, base_e):
    """The A2A transport's local combine of the chunks it received."""
    block, weights = _block(Case(outputs, lses, base_e), rank)
    acc = torch.zeros(block.shape[1:], dtype=weights.dtype)
    return combine.accumulate_into(acc, block, weights).to(outputs.dtype)


@PROPERTY_SETTINGS
@given(cases(), st.sampled_from([by_scaling, by_accumulating]))
def test_the_in_place_steps_match_the_reference(case: Case, step) -> None:
    _each_rank(case, step)


@PROPERTY_SETTINGS
@given(cases())
def test_weights_and_merged_lse_match_the_reference(case: Case) -> None:
    result = combine.combine_weights(case.lses, base_e=case.base_e)
    want = reference_merged_lse(case.lses, base_e=case.base_e)
    empty = want == -math.inf
    assert torch.equal(result.lse.double() == -math.inf, empty)
    live = want[~empty]
    assert ((result.lse.double()[~empty] - live).abs() <= 1e-6 * live.abs().clamp(min=1)).all()
    assert torch.isfinite(result.weights).all()
    sums = result.weights.sum(dim=0)
    assert torch.allclose(sums, torch.where(empty, 0.0, 1.0).float(), atol=1e-5)


# -- the properties can fail: a wrong combine is found by the same strategies -------------------


def _without_sanitize(lse: torch.Tensor) -> torch.Tensor:
    return lse


def _without_max_subtraction(lse: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(lse.amax(dim=0))


def _without_zero_weight_mask(outputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return outputs * weights.unsqueeze(-1)


BROKEN = {
    "sanitize_lse": _without_sanitize,
    "reference_max": _without_max_subtraction,
    "mask_zero_weight": _without_zero_weight_mask,
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_combine_step_is_found(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(combine, name, BROKEN[name])

    @settings(max_examples=200, deadline=None, database=None)
    @given(cases())
    def prop(case: Case) -> None:
        _each_rank(case, lse_combine)

    with pytest.raises(AssertionError):
        prop()


def test_a_combine_that_ignores_the_base_is_found() -> None:
    def base_e_always(outputs, lses, rank, *, base_e):
        return lse_combine(outputs, lses, rank)

    @settings(max_examples=200, deadline=None, database=None)
    @given(cases())
    def prop(case: Case) -> None:
        _each_rank(case, base_e_always)

    with pytest.raises(AssertionError):
        prop()
