"""The transports' weights (`harness.transport.weights`) against the oracle's `combine_weights`,
bit for bit: a Hypothesis property over adversarial LSEs (NaN, +-inf, -0, denormals, |LSE| up
to 3e38, all-empty rows, both bases, strided inputs, one row or all), explicit pins, and proof
that breaking any step of it is found."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.transport import weights
from harness.transport.combine import combine_weights
from harness.transport.testing import ADVERSARIAL, bit_equal, make_partials
from harness.transport.weights import StagedWeights

WORLDS = (1, 2, 3, 4, 8, 16)
HEADS = (1, 5, 6, 17, 96)  # under, at and over a vector's width of fp32 lanes
SCALES = (1.0, 30.0, 5000.0, 1e-40, 1e38)  # 1e-40 is a denormal; 1e38 * 3 overflows in l - m
SPECIALS = (math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-45, -1e-45, 3.4e38, -3.4e38)
PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def staged(shape: tuple[int, ...], row: int | None = None) -> StagedWeights:
    """A weights step on fresh buffers full of NaN (nothing stale may leak into a result)."""
    _, batch, heads = shape
    nan = math.nan
    return StagedWeights(
        work=torch.full(shape, nan),
        peak=torch.full((batch, heads), nan),
        norm=torch.full((batch, heads), nan),
        out=torch.full(shape if row is None else shape[1:], nan),
        row=row,
    )


def oracle(lses: torch.Tensor, base_e: bool, row: int | None) -> torch.Tensor:
    got = combine_weights(lses, base_e=base_e).weights
    return got if row is None else got[row]


@st.composite
def lse_cases(draw: st.DrawFn) -> tuple[torch.Tensor, bool, int | None]:
    """Adversarial `[W, B, H]` fp32 LSEs (sometimes a strided view, as A2A receives them), the
    base, and a row (AG+RS's own rank) or None (all of them)."""
    world, batch = draw(st.sampled_from(WORLDS)), draw(st.integers(1, 3))
    heads = draw(st.sampled_from(HEADS))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from(SCALES))
    offset = draw(st.sampled_from((0.0, 5000.0, -5000.0, 1e4)))
    lses = torch.randn(world, batch, heads, generator=gen) * scale + offset
    pick = torch.rand(lses.shape, generator=gen)
    share = draw(st.sampled_from((0.0, 0.2, 0.6, 1.0)))  # of entries replaced by a special
    specials = torch.tensor(SPECIALS)[torch.randint(0, len(SPECIALS), lses.shape, generator=gen)]
    lses = torch.where(pick < share, specials, lses)
    if draw(st.booleans()):  # whole (token, head)s empty, a shape the draws above rarely make
        lses[:, 0, : max(1, heads // 2)] = draw(st.sampled_from((math.nan, math.inf, -math.inf)))
    if draw(st.booleans()):  # strided: every rank's LSEs in a wider row, like the A2A chunks
        wide = torch.full((world, batch * heads + 3), 7.0)
        wide[:, : batch * heads] = lses.reshape(world, -1)
        lses = wide[:, : batch * heads].view(world, batch, heads)
    row = draw(st.one_of(st.none(), st.integers(0, world - 1)))
    return lses, draw(st.booleans()), row


def _check(case: tuple[torch.Tensor, bool, int | None]) -> None:
    lses, base_e, row = case
    step = staged(tuple(lses.shape), row)
    for _ in range(2):  # a second call on the same buffers gives the same bits
        got = step(lses, base_e=base_e)
        assert got is step.out
        assert bit_equal(got, oracle(lses, base_e, row)), f"{tuple(lses.shape)} row {row}"


@PROPERTY_SETTINGS
@given(lse_cases())
def test_the_staged_weights_are_the_oracle_s_bits(case) -> None:
    _check(case)


# -- explicit pins --------------------------------------------------------------------------

PINS = {
    "all empty (NaN, +inf, -inf)": [[math.nan], [math.inf], [-math.inf]],
    "signed zeros": [[-0.0], [0.0], [-0.0]],
    "denormals": [[1e-45], [-1e-45], [1e-40]],
    "huge": [[5000.0], [-5000.0], [5001.0]],
    "overflow in l - m": [[3.4e38], [-3.4e38], [-math.inf]],
    "one live among empties": [[math.nan], [-3.0], [math.inf]],
}


@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
@pytest.mark.parametrize("lses", list(PINS.values()), ids=list(PINS))
def test_pinned_lses_give_the_oracle_s_bits(lses, base_e) -> None:
    case = torch.tensor(lses, dtype=torch.float32).view(3, 1, 1)
    for row in (None, 0, 2):
        got = staged((3, 1, 1), row)(case, base_e=base_e)
        assert bit_equal(got, oracle(case, base_e, row)), row


def test_an_all_empty_head_gets_positive_zero_weights_and_a_live_one_sums_to_one() -> None:
    lses = torch.tensor([[math.nan, 1.0], [-math.inf, 2.0], [math.inf, 3.0]]).view(3, 1, 2)
    got = staged((3, 1, 2))(lses)
    assert bit_equal(got[:, 0, 0], torch.zeros(3))  # +0, not -0, not NaN
    assert torch.allclose(got[:, 0, 1].sum(), torch.tensor(1.0))


@pytest.mark.parametrize("pattern", ADVERSARIAL)
def test_every_adversarial_pattern_gives_the_oracle_s_bits(pattern: str) -> None:
    """The transport suites' patterns at the Kimi-K3 DCP16 shapes of both strategies."""
    for heads in (6, 96):
        parts = make_partials(16, 8, 16 * heads, 3, torch.float32, pattern=pattern, seed=3)
        lses = parts.lses[:, :, :heads].contiguous()
        for base_e in (True, False):
            for row in (None, 5):
                got = staged((16, 8, heads), row)(lses, base_e=base_e)
                assert bit_equal(got, oracle(lses, base_e, row)), (pattern, heads, base_e, row)


def test_out_must_have_the_shape_of_the_rows_it_holds() -> None:
    with pytest.raises(ValueError, match=r"weights out \(2, 3\) does not match \(4, 2, 3\)"):
        StagedWeights(
            work=torch.empty(4, 2, 3), peak=torch.empty(2, 3), norm=torch.empty(2, 3),
            out=torch.empty(2, 3),
        )  # fmt: skip


# -- the checks can fail: each step broken on purpose is found ------------------------------


def _sanitize_keeping_nan(work, lses):
    return torch.nan_to_num(lses, nan=math.nan, posinf=-math.inf, neginf=-math.inf, out=work)


def _sanitize_keeping_posinf(work, lses):
    return torch.nan_to_num(lses, nan=-math.inf, posinf=math.inf, neginf=-math.inf, out=work)


def _sanitize_with_finite_neginf(work, lses):  # nan_to_num's default for -inf: the lowest float
    return torch.nan_to_num(lses, nan=-math.inf, posinf=-math.inf, out=work)


def _shift_without_max(work, peak, base_e):
    return work.exp_() if base_e else work.exp2_()


def _shift_without_empty_max_fix(work, peak, base_e):
    torch.amax(work, dim=0, out=peak)
    work.sub_(peak)
    return work.exp_() if base_e else work.exp2_()


def _shift_always_base_e(work, peak, base_e):
    torch.amax(work, dim=0, out=peak)
    peak.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    return work.sub_(peak).exp_()


def _normalize_without_empty_fix(out, numerators, shifted, norm):
    torch.sum(shifted, dim=0, out=norm)
    return torch.div(numerators, norm, out=out)


def _normalize_clamping_too_much(out, numerators, shifted, norm):
    torch.sum(shifted, dim=0, out=norm)
    norm.clamp_min_(1.5)
    return torch.div(numerators, norm, out=out)


def _normalize_by_multiplying(out, numerators, shifted, norm):
    torch.sum(shifted, dim=0, out=norm)
    norm.clamp_min_(1.0)
    return torch.mul(numerators, norm, out=out)


BROKEN = {
    "sanitize_into": [
        _sanitize_keeping_nan, _sanitize_keeping_posinf, _sanitize_with_finite_neginf,
    ],
    "shift_by_max": [_shift_without_max, _shift_without_empty_max_fix, _shift_always_base_e],
    "normalize_into": [
        _normalize_without_empty_fix, _normalize_clamping_too_much, _normalize_by_multiplying,
    ],
}  # fmt: skip
MUTANTS = [(step, fn) for step, fns in BROKEN.items() for fn in fns]


@pytest.mark.parametrize(("step", "broken"), MUTANTS, ids=[fn.__name__ for _, fn in MUTANTS])
def test_a_broken_weights_step_is_found(step, broken, monkeypatch) -> None:
    monkeypatch.setattr(weights, step, broken)

    @settings(max_examples=300, deadline=None, database=None)
    @given(lse_cases())
    def prop(case) -> None:
        _check(case)

    with pytest.raises(AssertionError):
        prop()


def test_the_weights_step_reads_natural_log_lses_unless_told_otherwise() -> None:
    """As the oracle's `combine_weights` does: a caller that leaves `base_e` out gets its weights;
    the control reads the same LSEs as log2 and gets other weights."""
    lses = torch.randn(4, 2, 6, generator=torch.Generator().manual_seed(7)) * 4
    oracle = combine_weights(lses).weights
    assert bit_equal(staged((4, 2, 6))(lses), oracle)
    assert not bit_equal(staged((4, 2, 6))(lses, base_e=False), oracle)
