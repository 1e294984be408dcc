"""The combine oracle against an independent per-element float64 reference, on every adversarial
LSE pattern, and proof that the checks catch a wrong combine (deliberate mutations)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from harness.transport import combine
from harness.transport.combine import combine_local, lse_combine
from harness.transport.reference import reference_combine, reference_merged_lse
from harness.transport.testing import (
    ADVERSARIAL,
    PATTERNS,
    assert_matches,
    bit_equal,
    make_partials,
)

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def naive_combine(outputs: torch.Tensor, lses: torch.Tensor, rank: int, base_e: bool):
    """The definitions of `harness.transport.reference`, one (token, head) at a time, in
    Python floats (float64)."""
    world, batch, heads, dim = outputs.shape
    h = heads // world
    exp = math.exp if base_e else (lambda x: 2.0**x)
    log = math.log if base_e else math.log2
    result = torch.zeros(batch, h, dim, dtype=torch.float64)
    for b in range(batch):
        for j in range(h):
            head = rank * h + j
            ls = [float(lses[n, b, head]) for n in range(world)]
            ls = [-math.inf if math.isnan(v) or v == math.inf else v for v in ls]
            m = max(ls)
            m = 0.0 if m == -math.inf else m
            s = sum(exp(v - m) for v in ls)
            if s == 0.0:
                continue  # every shard empty: zeros
            total = m + log(s)
            for n in range(world):
                w = exp(ls[n] - total)
                if w > 0.0:
                    result[b, j] += w * outputs[n, b, head].double()
    return result


def naive_merged_lse(lses: torch.Tensor, base_e: bool) -> list[float]:
    """L per entry of `[W, N]` LSEs, one entry at a time in Python floats."""
    exp = math.exp if base_e else (lambda x: 2.0**x)
    log = math.log if base_e else math.log2
    merged = []
    for column in lses.double().T.tolist():
        ls = [-math.inf if math.isnan(v) or v == math.inf else v for v in column]
        m = max(ls)
        m = 0.0 if m == -math.inf else m
        s = sum(exp(v - m) for v in ls)
        merged.append(-math.inf if s == 0.0 else m + log(s))
    return merged


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
def test_the_float64_reference_matches_the_per_element_loop(pattern: str, base_e: bool) -> None:
    """The suites' oracle (`harness.transport.reference`, vectorized numpy) against the plain
    loop above: the same definitions, written twice, agree to float64 rounding."""
    parts = make_partials(4, 2, 8, 6, torch.float32, pattern=pattern, seed=31)
    for rank in range(4):
        got = reference_combine(parts.outputs, parts.lses, rank, base_e=base_e)
        want = naive_combine(parts.outputs, parts.lses, rank, base_e)
        assert got.dtype == torch.float64
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12, equal_nan=False), rank
    merged = reference_merged_lse(parts.lses, base_e=base_e).flatten().tolist()
    want = naive_merged_lse(parts.lses.reshape(4, -1), base_e)
    assert merged == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
def test_the_merged_lse_matches_the_reference(pattern: str, base_e: bool) -> None:
    """`combine_weights(...).lse` is the merged L of the definitions (-inf where every shard is
    empty), not only a by-product of the weights."""
    parts = make_partials(4, 3, 8, 4, torch.float32, pattern=pattern, seed=41)
    got = combine.combine_weights(parts.lses, base_e=base_e).lse.double()
    want = reference_merged_lse(parts.lses, base_e=base_e)
    empty = want == -math.inf
    assert torch.equal(got == -math.inf, empty), "all-empty entries"
    scale = want[~empty].abs().clamp(min=1.0)
    assert ((got[~empty] - want[~empty]).abs() <= 1e-6 * scale).all()


def check_all_cases(fn: Callable[..., torch.Tensor]) -> None:
    """Every pattern, both LSE bases, two world sizes, every rank: `fn` must match the naive
    reference. Raises AssertionError naming the first case that does not."""
    for world in (2, 4):
        for pattern in PATTERNS:
            parts = make_partials(world, 2, 2 * world, 8, torch.float32, pattern=pattern, seed=7)
            for base_e in (True, False):
                for rank in range(world):
                    expected = naive_combine(parts.outputs, parts.lses, rank, base_e)
                    actual = fn(parts.outputs, parts.lses, rank, base_e=base_e)
                    what = f"world={world} pattern={pattern} base_e={base_e} rank={rank}"
                    assert_matches(actual, expected.float(), what=what)
                check_weights(parts.lses, base_e=base_e, what=f"world={world} {pattern}")


def check_weights(lses: torch.Tensor, *, base_e: bool, what: str) -> None:
    """The weights AG+RS uses directly: finite, in [0, 1], summing to 1 (0 if all empty)."""
    weights = combine.combine_weights(lses, base_e=base_e).weights
    assert torch.isfinite(weights).all(), f"{what}: non-finite weights"
    assert ((weights >= 0) & (weights <= 1)).all(), f"{what}: weights outside [0, 1]"
    sums = weights.sum(dim=0)
    any_live = torch.isfinite(combine.sanitize_lse(lses)).any(dim=0)
    expected = torch.where(any_live, 1.0, 0.0)
    assert torch.allclose(sums, expected, atol=1e-5), f"{what}: weight sums {sums}"


def test_every_case_matches_the_naive_reference() -> None:
    check_all_cases(lse_combine)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
def test_pattern_dtype_base(pattern: str, dtype: torch.dtype, base_e: bool) -> None:
    parts = make_partials(4, 3, 8, 16, dtype, pattern=pattern, seed=11)
    for rank in range(4):
        got = lse_combine(parts.outputs, parts.lses, rank, base_e=base_e)
        assert got.dtype == dtype
        want = naive_combine(parts.outputs, parts.lses, rank, base_e).to(dtype)
        assert_matches(got, want, what=f"{pattern} rank {rank}")


def test_all_empty_gives_exact_zeros_without_nan() -> None:
    parts = make_partials(4, 2, 8, 8, torch.bfloat16, pattern="all_empty", seed=3)
    assert not torch.isfinite(parts.lses).any()
    assert torch.isnan(parts.outputs).any()
    for rank in range(4):
        got = lse_combine(parts.outputs, parts.lses, rank)
        assert bit_equal(got, torch.zeros_like(got))


def test_weight_zero_rank_contributes_exactly_zero_even_if_nan() -> None:
    out = torch.randn(3, 1, 3, 4)
    lse = torch.tensor([[[0.5, 1.0, 2.0]], [[0.25, 3.0, 1.0]], [[0.0, 0.0, 0.0]]])
    expected = combine_local(out[:2, :, :1], lse[:2, :, :1])  # ranks 0 and 1 only, head 0
    # Rank 2: weight 0 by -inf, by NaN, by +inf, by underflow; its output is NaN every time.
    for dead in (-math.inf, math.nan, math.inf, -1e5):
        bad_out, bad_lse = out.clone(), lse.clone()
        bad_out[2] = math.nan
        bad_lse[2] = dead
        assert bit_equal(lse_combine(bad_out, bad_lse, 0), expected), dead


def test_one_hot_returns_the_live_rank_exactly() -> None:
    parts = make_partials(4, 2, 8, 8, torch.bfloat16, pattern="one_hot", seed=5)
    for rank in range(4):
        got = lse_combine(parts.outputs, parts.lses, rank)
        own = parts.lses[:, :, rank * 2 : rank * 2 + 2]
        alive = torch.isfinite(own).int().argmax(dim=0)  # [B, h]
        src = parts.outputs[:, :, rank * 2 : rank * 2 + 2]
        picked = torch.gather(src, 0, alive[None, :, :, None].expand(1, -1, -1, 8))[0]
        assert bit_equal(got, picked)
        assert torch.equal(got[..., 0].float(), alive.float() + 1)  # channel 0 = source rank + 1


def test_huge_offset_stays_finite() -> None:
    parts = make_partials(4, 2, 8, 8, torch.float32, pattern="random", seed=9)
    shifted = parts.lses + 10000.0
    got = lse_combine(parts.outputs, shifted, 1)
    assert torch.isfinite(got).all()
    assert_matches(got, naive_combine(parts.outputs, shifted, 1, True).float(), what="1e4")


def test_base_2_equals_base_e_after_conversion() -> None:
    parts = make_partials(4, 2, 8, 8, torch.float64, pattern="mixed", seed=13)
    lses = parts.lses.double()  # fp64, so the conversion itself does not round
    for rank in range(4):
        assert_matches(
            lse_combine(parts.outputs, lses / math.log(2.0), rank, base_e=False),
            lse_combine(parts.outputs, lses, rank, base_e=True),
            what=f"rank {rank}",
        )


def test_sixteen_ranks_kimi_geometry() -> None:
    parts = make_partials(16, 1, 96, 512, torch.bfloat16, pattern="mixed", seed=1)
    for rank in (0, 7, 15):
        got = lse_combine(parts.outputs, parts.lses, rank)
        assert got.shape == (1, 6, 512)
        want = naive_combine(parts.outputs[:, :, :, :4], parts.lses, rank, True).to(got.dtype)
        assert_matches(got[..., :4], want, what=f"rank {rank}")


def test_fp64_inputs_are_combined_in_fp64() -> None:
    parts = make_partials(2, 1, 2, 4, torch.float64, pattern="random", seed=2)
    got = lse_combine(parts.outputs, parts.lses.double(), 0)
    assert got.dtype == torch.float64
    want = naive_combine(parts.outputs, parts.lses.double(), 0, True)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("outputs", "lses", "rank", "message"),
    [
        (torch.zeros(2, 1, 4), torch.zeros(2, 1), 0, "must be \\[W, B, H, D\\]"),
        (torch.zeros(2, 1, 4, 3), torch.zeros(2, 1, 3), 0, r"must be \[W, B, H\] = \(2, 1, 4\)"),
        (torch.zeros(2, 1, 4, 3), torch.zeros(2, 1, 4, dtype=torch.bfloat16), 0, "fp32 or fp64"),
        (torch.zeros(2, 1, 4, 3), torch.zeros(2, 1, 4), 2, "outside the world"),
        (torch.zeros(3, 1, 4, 3), torch.zeros(3, 1, 4), 0, "cannot be split"),
    ],
)
def test_bad_inputs_are_rejected(outputs, lses, rank, message) -> None:
    with pytest.raises(ValueError, match=message):
        lse_combine(outputs, lses, rank)


def test_partials_oracle_is_the_reference_and_blocks_are_consistent() -> None:
    parts = make_partials(4, 2, 8, 8, torch.bfloat16, pattern="mixed", seed=21)
    whole = parts.outputs
    for rank in range(4):
        reference = reference_combine(whole, parts.lses, rank).to(torch.bfloat16)
        assert bit_equal(parts.expected(rank), reference)
        assert_matches(lse_combine(whole, parts.lses, rank), reference, what=f"rank {rank}")
        assert bit_equal(parts.head_block(rank)[0], whole[:, :, rank * 2 : rank * 2 + 2])
        assert bit_equal(parts.of_rank(rank)[0], whole[rank])
    clean = make_partials(4, 2, 8, 8, torch.bfloat16, pattern="random", seed=21).outputs
    assert torch.equal(clean[:, 1, 5, 0].float(), torch.arange(4.0) + 1)  # source rank + 1
    assert torch.equal(clean[2, 1, :, 1].float(), torch.arange(8.0) + 1)  # head + 1
    assert torch.equal(clean[2, :, 5, 2].float(), torch.arange(2.0) + 1)  # token + 1


def test_partials_answer_the_same_however_often_asked_and_whatever_a_caller_does() -> None:
    """Blocks are built once and kept: a second ask, or a caller writing into what it was
    given, changes nothing a later ask sees; a fresh build from the same seed agrees bit for
    bit."""
    parts = make_partials(4, 2, 8, 8, torch.bfloat16, pattern="mixed", seed=33)
    first_out, first_lse = parts.of_rank(1)
    first_block = parts.block(2, 1)
    first_expected = parts.expected(1)
    for given in (first_out, first_lse, first_block, parts.head_block(1)[0]):
        given.fill_(7)
    fresh = make_partials(4, 2, 8, 8, torch.bfloat16, pattern="mixed", seed=33)
    assert bit_equal(parts.of_rank(1)[0], fresh.of_rank(1)[0])
    assert bit_equal(parts.of_rank(1)[1], fresh.lses[1])
    assert bit_equal(parts.block(2, 1), fresh.block(2, 1))
    assert bit_equal(parts.expected(1), fresh.expected(1))
    assert bit_equal(first_expected, fresh.expected(1))
    assert bit_equal(parts.outputs, fresh.outputs)


def test_patterns_are_what_they_claim() -> None:
    w = 4
    for pattern in PATTERNS:
        parts = make_partials(w, 4, 8, 4, torch.float32, pattern=pattern, seed=17)
        finite = torch.isfinite(parts.lses)
        if pattern == "all_empty":
            assert not finite.any()
        if pattern == "one_hot":
            assert torch.equal(finite.sum(0), torch.ones(4, 8, dtype=torch.long))
        if pattern == "nan_inf":
            assert torch.isnan(parts.lses).any() and torch.isposinf(parts.lses).any()
        if pattern == "underflow_nan_output":
            assert finite.all() and torch.isnan(parts.outputs).any()
        if pattern == "huge_offset":
            assert (parts.lses > 4000).all()
        if pattern == "mixed":
            assert (~finite).any() and finite.any()
    assert set(ADVERSARIAL) == set(PATTERNS) - {"random"}


# -- mutations: each wrong combine must fail the checks above ------------------------------------


def _no_max_subtraction(lse: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(lse.amax(dim=0))


def _no_empty_mask(lse: torch.Tensor) -> torch.Tensor:
    return lse


def _no_zero_weight_mask(outputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return outputs * weights.unsqueeze(-1)


def _no_all_empty_guard(weights: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    return weights


MUTATIONS = {
    "drop max subtraction": ("reference_max", _no_max_subtraction),
    "drop empty-shard mask (NaN/+inf kept)": ("sanitize_lse", _no_empty_mask),
    "drop zero-weight mask (0 * NaN)": ("mask_zero_weight", _no_zero_weight_mask),
    "drop all-empty guard": ("all_empty_guard", _no_all_empty_guard),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_wrong_combine_fails_the_checks(mutation: str, monkeypatch) -> None:
    name, broken = MUTATIONS[mutation]
    monkeypatch.setattr(combine, name, broken)
    with pytest.raises(AssertionError):
        check_all_cases(lse_combine)


def test_a_wrong_base_or_head_slice_fails_the_checks() -> None:
    def ignores_base(outputs, lses, rank, *, base_e=True):
        return lse_combine(outputs, lses, rank)

    def off_by_one_rank(outputs, lses, rank, *, base_e=True):
        return lse_combine(outputs, lses, (rank + 1) % outputs.shape[0], base_e=base_e)

    for wrong in (ignores_base, off_by_one_rank):
        with pytest.raises(AssertionError):
            check_all_cases(wrong)


# -- the transports' in-place steps: the same math, and the mask still matters -----------------


def _own_block(outputs: torch.Tensor, lses: torch.Tensor, rank: int, base_e: bool):
    h = outputs.shape[2] // outputs.shape[0]
    own = slice(rank * h, (rank + 1) * h)
    return outputs[:, :, own], combine.combine_weights(lses[:, :, own], base_e=base_e).weights


def combine_by_accumulating(outputs, lses, rank, *, base_e=True):
    """What the A2A transport does with the chunks it received."""
    block, weights = _own_block(outputs, lses, rank, base_e)
    acc = torch.zeros(block.shape[1:], dtype=weights.dtype)
    return combine.accumulate_into(acc, block, weights).to(outputs.dtype)


def staged(acc: torch.Tensor, outputs: torch.Tensor, weights: torch.Tensor, group: int):
    """`StagedAccumulation` on fresh buffers the shapes of `accumulate_into`'s arguments: the
    weights are copied in, so the staging starts full of NaN to show nothing stale leaks."""
    world = outputs.shape[0]
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[outputs.element_size()]
    step = combine.StagedAccumulation(
        torch.full_like(acc, math.nan),
        outputs.clone(),  # masked in place: the staging is the caller's
        weights=torch.full(weights.shape, math.nan, dtype=acc.dtype),
        keep=torch.full(weights.shape, -1, dtype=ints),
        scratch=torch.full((min(group, world) * acc.numel(),), math.nan, dtype=acc.dtype),
        group=group,
    )
    return step(weights)


def combine_by_staging(outputs, lses, rank, *, base_e=True, group=3):
    """What the A2A transport does with the chunks it received, on its static buffers."""
    block, weights = _own_block(outputs, lses, rank, base_e)
    acc = torch.empty(block.shape[1:], dtype=weights.dtype)
    return staged(acc, block, weights, group).to(outputs.dtype)


def combine_by_scaling(outputs, lses, rank, *, base_e=True):
    """What the AG+RS transport does before its reduce-scatter (which is the sum here)."""
    block, weights = _own_block(outputs, lses, rank, base_e)
    dst = torch.empty(block.shape, dtype=weights.dtype)
    return combine.scale_into(dst, block, weights).sum(dim=0).to(outputs.dtype)


@pytest.mark.parametrize("fn", [combine_by_accumulating, combine_by_staging, combine_by_scaling])
def test_the_in_place_steps_match_the_naive_reference(fn) -> None:
    check_all_cases(fn)


def _accumulate_unmasked(acc, outputs, weights):
    for shard, weight in zip(outputs, weights.unsqueeze(-1), strict=True):
        acc.addcmul_(shard, weight)
    return acc


def _scale_unmasked(dst, outputs, weights):
    return torch.mul(outputs, weights.unsqueeze(-1), out=dst)


@pytest.mark.parametrize(
    ("fn", "name", "broken"),
    [
        (combine_by_accumulating, "accumulate_into", _accumulate_unmasked),
        (combine_by_scaling, "scale_into", _scale_unmasked),
    ],
    ids=["accumulate_into", "scale_into"],
)
def test_an_in_place_step_without_its_zero_weight_mask_fails(fn, name, broken, monkeypatch):
    monkeypatch.setattr(combine, name, broken)
    with pytest.raises(AssertionError, match="non-finite"):
        check_all_cases(fn)


def test_combine_local_writes_into_out_or_casts_to_out_dtype() -> None:
    parts = make_partials(2, 2, 4, 3, torch.bfloat16, pattern="mixed", seed=51)
    block, lses = parts.head_block(1)
    want = reference_combine(parts.outputs, parts.lses, 1)
    as_fp32 = combine_local(block, lses, out_dtype=torch.float32)
    assert as_fp32.dtype == torch.float32
    assert_matches(as_fp32, want.float(), what="out_dtype")
    out = torch.full((2, 2, 3), 5.0, dtype=torch.float64)
    assert combine_local(block, lses, out=out) is out
    assert_matches(out, want, what="out")
    base_2 = combine_local(block, lses, base_e=False)
    assert_matches(base_2, reference_combine(parts.outputs, parts.lses, 1, base_e=False).bfloat16())


@pytest.mark.parametrize(
    ("outputs", "lses"),
    [(torch.zeros(2, 1, 3), torch.zeros(2, 1)), (torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 2))],
)
def test_combine_local_rejects_mismatched_shapes(outputs, lses) -> None:
    with pytest.raises(ValueError, match=r"combine_local expects outputs \[W, B, h, D\]"):
        combine_local(outputs, lses)


def fp64_digits_that_matter(wide: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Two shards of one (token, head), D = 3, where only one input is fp64 and its digits
    beyond fp32 reach the result. "outputs": fp64 outputs that fp32 cannot hold (1/3, 1/7,
    ...) and equal fp32 LSEs (weights exactly 1/2 in any precision). "lses": fp64 LSEs 0 and
    ln 2 (weights 1/3 and 2/3, which fp32 cannot hold) and small-integer fp32 outputs."""
    if wide == "outputs":
        outputs = torch.tensor(
            [[1 / 3, 1 / 7, 1 / 11], [1 / 13, 1 / 17, 2 / 3]], dtype=torch.float64
        )
        lses = torch.zeros(2, dtype=torch.float32)
    else:
        outputs = torch.tensor([[1.0, 2.0, -3.0], [5.0, -1.0, 0.5]], dtype=torch.float32)
        lses = torch.tensor([0.0, math.log(2.0)], dtype=torch.float64)
    return outputs.view(2, 1, 1, 3), lses.view(2, 1, 1)


def naive_one_head(outputs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """`naive_combine` of `[W, B, 1, D]` partials, each head repeated W times, so rank 0's
    share is exactly that head."""
    world = outputs.shape[0]
    want = naive_combine(outputs.repeat(1, 1, world, 1), lses.repeat(1, 1, world), 0, True)
    assert want.shape == outputs.shape[1:]
    return want


@pytest.mark.parametrize("wide", ["outputs", "lses"], ids=["fp64-outputs", "fp64-lses"])
def test_one_fp64_input_makes_the_whole_combine_fp64(wide: str) -> None:
    """The accumulation follows the wider input, whichever it is: rounding that input to fp32
    anywhere costs 1e-9 to 1e-7 against the per-element float64 loop, far above the 1e-12
    allowed (the control below shows that tolerance catches it)."""
    outputs, lses = fp64_digits_that_matter(wide)
    want = naive_one_head(outputs, lses)
    got = combine_local(outputs, lses, out_dtype=torch.float64)
    assert got.dtype == torch.float64
    assert torch.allclose(got, want, rtol=1e-12, atol=0.0), (got - want).abs().max()
    into = torch.zeros(1, 1, 3, dtype=torch.float64)
    assert combine_local(outputs, lses, out=into) is into
    assert torch.allclose(into, want, rtol=1e-12, atol=0.0)
    narrowed = combine_local(outputs.float(), lses.float(), out_dtype=torch.float64)
    assert not torch.allclose(narrowed, want, rtol=1e-12, atol=0.0)  # the control


def test_the_weights_default_to_base_e_and_compute_in_fp32_at_least() -> None:
    parts = make_partials(4, 2, 8, 4, torch.float32, pattern="random", seed=71)
    by_default = combine.combine_weights(parts.lses)
    assert torch.equal(by_default.lse, combine.combine_weights(parts.lses, base_e=True).lse)
    want = reference_merged_lse(parts.lses, base_e=True)
    assert torch.allclose(by_default.lse.double(), want, rtol=1e-6)
    narrow = combine.combine_weights(parts.lses.bfloat16())
    assert narrow.weights.dtype == narrow.lse.dtype == torch.float32  # never 16-bit math


# -- the AG+RS scaling step: copy, scale, mask by AND; the same bits as before ----------------


def scale_multiply_then_fill(dst, outputs, weights):
    """The scaling step as it was before: one multiply into `dst`, then the zero-weight
    entries overwritten with 0 by a masked fill. Kept here as the bit-for-bit pin."""
    w = weights.unsqueeze(-1)
    torch.mul(outputs, w, out=dst)
    return dst.masked_fill_(w == 0, 0.0)


EDGE_VALUES = (math.nan, math.inf, -math.inf, 3e38, -3e38, 5000.0, -5000.0, 88.0, -104.0, 0.0)


def edge_case(world: int, batch: int, heads: int, dim: int, dtype: torch.dtype, seed: int):
    """LSEs drawn from NaN/+inf/-inf/huge/overflowing values and N(0, 3^2) at random, and
    outputs with NaN, +-inf and 1e30 anywhere (live shards too), to pin every branch."""
    gen = torch.Generator().manual_seed(seed)
    lses = torch.randn(world, batch, heads, generator=gen) * 3
    edges = torch.tensor(EDGE_VALUES)[torch.randint(0, len(EDGE_VALUES), lses.shape, generator=gen)]
    lses = torch.where(torch.rand(lses.shape, generator=gen) < 0.5, edges, lses)
    outputs = torch.randn(world, batch, heads, dim, generator=gen)
    junk = torch.tensor([math.nan, math.inf, -math.inf, 1e30])
    picks = junk[torch.randint(0, 4, outputs.shape, generator=gen)]
    outputs = torch.where(torch.rand(outputs.shape, generator=gen) < 0.2, picks, outputs)
    return outputs.to(dtype), lses


def _scaling_inputs(world: int, pattern: str, dtype: torch.dtype, seed: int):
    batch, heads, dim = 3, 2 * world, 16
    if pattern == "edges":
        return edge_case(world, batch, heads, dim, dtype, seed)
    parts = make_partials(world, batch, heads, dim, dtype, pattern=pattern, seed=seed)
    return parts.outputs, parts.lses


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern", (*PATTERNS, "edges"))
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
def test_the_scaling_step_gives_the_bits_of_multiply_then_fill(pattern, dtype, base_e) -> None:
    """Every LSE pattern and NaN/inf/huge inputs, in the layout AG+RS uses (a rank's partial
    `[B, H, D]` viewed destination-major, strided), at 2 and 16 ranks: the same bits."""
    for world, ranks in ((2, (0, 1)), (16, (0, 9, 15))):
        outputs, lses = _scaling_inputs(world, pattern, dtype, seed=world)
        for rank in ranks:
            part = outputs[rank]  # [B, H, D], what this rank hands to reduce_outputs
            batch, heads, dim = part.shape
            h = heads // world
            weights = combine.combine_weights(lses, base_e=base_e).weights[rank]
            src = part.reshape(batch, world, h, dim).transpose(0, 1)
            w = weights.view(batch, world, h).transpose(0, 1)
            got = combine.scale_into(torch.empty(world, batch, h, dim), src, w)
            want = scale_multiply_then_fill(torch.empty(world, batch, h, dim), src, w)
            assert bit_equal(got, want), f"world={world} rank={rank}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_scaling_step_gives_the_same_bits_for_any_weight(dtype) -> None:
    """Weights no combine produces too: -0, NaN, +-inf, negative, subnormal, against outputs
    holding NaN, +-inf, +-0 and huge values."""
    special = [0.0, -0.0, math.nan, math.inf, -math.inf, -1.0, 1e-45, 1.0, 0.5, 3e38]
    values = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30, -1e30, 1.5, -2.25]
    weights = torch.tensor(special).repeat_interleave(len(values)).view(len(special), -1)
    outputs = torch.tensor(values).repeat(len(special)).view(len(special), -1, 1)
    outputs = outputs.expand(-1, -1, 4).to(dtype)
    got = combine.scale_into(torch.empty(outputs.shape), outputs, weights)
    want = scale_multiply_then_fill(torch.empty(outputs.shape), outputs, weights)
    assert bit_equal(got, want)
    assert bit_equal(got[:2], torch.zeros_like(got[:2])), "+0 wherever the weight is +-0"


def accumulate_selected(acc, outputs, weights):
    """A2A's accumulation as it was before: each shard selected against its weight's mask
    (0 where the weight is not positive), then multiplied and added. The bit-for-bit pin."""
    zero = torch.zeros((), dtype=outputs.dtype)
    for shard, weight in zip(outputs, weights.unsqueeze(-1), strict=True):
        acc.addcmul_(torch.where(weight > 0, shard, zero), weight)
    return acc


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern", (*PATTERNS, "edges"))
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
def test_the_accumulation_gives_the_bits_of_selecting_each_shard(pattern, dtype, base_e) -> None:
    """What the A2A transport does with the chunks it received, at 2 and 16 ranks."""
    for world, ranks in ((2, (0, 1)), (16, (0, 9, 15))):
        outputs, lses = _scaling_inputs(world, pattern, dtype, seed=world + 1)
        for rank in ranks:
            block, weights = _own_block(outputs, lses, rank, base_e)
            got = combine.accumulate_into(torch.zeros(block.shape[1:]), block, weights)
            want = accumulate_selected(torch.zeros(block.shape[1:]), block, weights)
            assert bit_equal(got, want), f"world={world} rank={rank}"
            for group in (1, 3, world):  # one source at a time, uneven groups, all at once
                got = staged(torch.empty(block.shape[1:]), block, weights, group)
                assert bit_equal(got, want), f"world={world} rank={rank} group={group}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_accumulation_gives_the_same_bits_for_any_weight(dtype) -> None:
    special = [0.0, -0.0, math.nan, math.inf, -math.inf, -1.0, 1e-45, 1.0, 0.5, 3e38]
    values = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30, -1e30, 1.5, -2.25]
    weights = torch.tensor(special).view(-1, 1).expand(-1, len(values))
    outputs = torch.tensor(values).view(1, -1, 1).expand(len(special), -1, 4).to(dtype)
    for lo in range(len(special)):  # every weight meets every value, one shard at a time
        got = combine.accumulate_into(torch.ones(len(values), 4), outputs[lo:], weights[lo:])
        want = accumulate_selected(torch.ones(len(values), 4), outputs[lo:], weights[lo:])
        assert bit_equal(got, want), special[lo]
        # The staged step overwrites its accumulator: the pin's, from zero.
        zeroed = accumulate_selected(torch.zeros(len(values), 4), outputs[lo:], weights[lo:])
        for group in (1, 4):
            got = staged(torch.ones(len(values), 4), outputs[lo:], weights[lo:], group)
            assert bit_equal(got, zeroed), (special[lo], group)


def test_the_bit_pin_can_fail() -> None:
    """A step that forgets the mask differs from the pin where a zero weight meets a NaN."""
    outputs, lses = edge_case(4, 3, 8, 16, torch.bfloat16, seed=1)
    weights = combine.combine_weights(lses).weights
    assert (weights == 0).any()
    unmasked = torch.mul(outputs, weights.unsqueeze(-1), out=torch.empty(outputs.shape))
    want = scale_multiply_then_fill(torch.empty(outputs.shape), outputs, weights)
    assert not bit_equal(unmasked, want)
    got = combine.scale_into(torch.empty(outputs.shape), outputs, weights)
    assert bit_equal(got, want)


def test_the_scaling_step_matches_the_float64_reference() -> None:
    """Scaled and summed, the step is the combine: against the independent numpy oracle on
    every pattern, 16 ranks, both bases (the edges inputs put NaN on live shards, which the
    oracle propagates, so they are pinned bit-for-bit above instead)."""
    for pattern in PATTERNS:
        parts = make_partials(16, 2, 32, 8, torch.bfloat16, pattern=pattern, seed=61)
        outputs = parts.outputs
        for base_e in (True, False):
            for rank in (0, 7, 15):
                got = combine_by_scaling(outputs, parts.lses, rank, base_e=base_e)
                want = reference_combine(outputs, parts.lses, rank, base_e=base_e)
                assert_matches(got, want.to(got.dtype), what=f"{pattern} rank {rank}")


def test_the_staged_accumulation_wants_a_mask_as_wide_as_the_outputs() -> None:
    """The mask is ANDed with the outputs' own bits (bf16 here: int16), not the fp32 staging's."""
    outputs = torch.zeros(2, 1, 1, 3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"keep must be torch\.int16, got torch\.int32"):
        combine.StagedAccumulation(
            torch.zeros(1, 1, 3), outputs, weights=torch.zeros(2, 1, 1),
            keep=torch.zeros(2, 1, 1, dtype=torch.int32), scratch=torch.zeros(6), group=2,
        )  # fmt: skip
