"""`first_mismatch` judges closeness exactly as `torch.testing.assert_close` does (its oracle
here), without importing `torch.testing` on the ranks."""

from __future__ import annotations

import math

import pytest
import torch
from _support.gloo_spawn import gloo_group, spawn
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.capture import check
from harness.capture.check import first_mismatch
from harness.errors import UsageError

SPECIAL = (math.nan, math.inf, -math.inf, 0.0, -0.0)
values = st.one_of(
    st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, width=32),
    st.sampled_from(SPECIAL),
)


def assert_close_passes(a: torch.Tensor, e: torch.Tensor, **tol: float) -> bool:
    try:
        torch.testing.assert_close(a.float(), e.float(), **tol)
    except AssertionError:
        return False
    return True


@settings(max_examples=150, deadline=None)
@given(
    pairs=st.lists(st.tuples(values, values), min_size=1, max_size=12),
    nudge=st.sampled_from((0.0, 1e-7, 1e-5, 1e-3, 2e-2, 0.5)),
    tol=st.sampled_from(({}, {"rtol": 2e-2, "atol": 2e-2}, {"rtol": 1.6e-2, "atol": 1e-5})),
    dtype=st.sampled_from((torch.float32, torch.bfloat16, torch.float16)),
)
def test_agrees_with_assert_close(pairs, nudge, tol, dtype) -> None:
    actual = torch.tensor([a for a, _ in pairs], dtype=torch.float32)
    expected = torch.tensor([e for _, e in pairs], dtype=torch.float32)
    # Half of the pairs are near copies: closeness then hinges on the tolerances.
    near = expected * (1 + nudge) + nudge
    actual = torch.where(torch.arange(len(pairs)) % 2 == 0, near, actual).to(dtype)
    expected = expected.to(dtype)
    verdict = first_mismatch([actual], [expected], **tol)
    assert (verdict is None) == assert_close_passes(actual, expected, **tol), verdict


def test_names_the_output_count_and_the_worst_element() -> None:
    ok = torch.zeros(2, 3)
    bad = ok.clone()
    bad[1, 2] = 0.5
    bad[0, 0] = 0.1
    assert first_mismatch([ok, ok], [ok, ok], rtol=0.0, atol=0.0) is None
    text = first_mismatch([ok, bad], [ok, ok], rtol=0.0, atol=1e-3)
    assert text is not None and text.startswith("output 1: Tensor-likes are not close!")
    assert "Mismatched elements: 2 / 6 (33.3%)" in text
    assert "Greatest absolute difference: 0.5 at index (1, 2)" in text
    assert first_mismatch([ok], [ok, ok]) == "1 outputs, expected 2"


def test_nan_and_shape_are_mismatches() -> None:
    nan = torch.tensor([1.0, math.nan])
    text = first_mismatch([nan], [torch.tensor([1.0, 2.0])], rtol=1.0, atol=1.0)
    assert text is not None and "at index (1,)" in text
    assert first_mismatch([nan], [nan.clone()]) is not None  # NaN is never close to NaN
    inf = torch.tensor([math.inf, -math.inf])
    assert first_mismatch([inf], [inf.clone()]) is None
    text = first_mismatch([torch.zeros(2, 3)], [torch.zeros(3, 2)])
    assert text == "output 0: shapes differ: [2, 3], expected [3, 2]"


def test_tolerances_come_in_pairs() -> None:
    with pytest.raises(ValueError, match="both rtol and atol"):
        first_mismatch([torch.zeros(1)], [torch.zeros(1)], rtol=0.1)


class ThreeRanks:
    """The two collectives of `ranks_failing_each` over a fake world of three ranks: this rank
    is rank 0, the others' failure masks are given."""

    def __init__(self, others: tuple[int, int]) -> None:
        self.others = others
        self.calls: list[tuple[str, int]] = []

    def any_nonzero(self, value: int, *, device: object = "cpu") -> bool:
        self.calls.append(("all_reduce", value))
        return any((value, *self.others))

    def gather(self, value: int, *, device: object = "cpu") -> tuple[int, ...]:
        self.calls.append(("all_gather", value))
        return (value, *self.others)


def test_many_checks_agree_in_one_collective_each_attributed_to_its_ranks(monkeypatch) -> None:
    """Every check of a rank travels in one collective (one bit each); each check's failing
    ranks come back on their own, whichever bit and rank they are."""
    world = ThreeRanks((0b101, 0))  # rank 1 failed checks 0 and 2
    monkeypatch.setattr(check, "any_rank_nonzero", world.any_nonzero)
    monkeypatch.setattr(check, "gather_ints", world.gather)
    assert check.ranks_failing_each([True, False, True]) == ((1,), (0,), (1,))
    assert world.calls == [("all_reduce", 0b010), ("all_gather", 0b010)]
    assert check.ranks_failing_each([False] * 3) == ((0, 1), (0,), (0, 1))
    assert check.ranks_failing_each([True]) == ((1,),)
    assert check.ranks_failing_each([False]) == ((0, 1),)
    assert [name for name, _ in world.calls].count("all_gather") == 4  # one mask exchange each
    for count in (0, check.MAX_CHECKS_AT_ONCE + 1):
        with pytest.raises(UsageError, match=f"1 to 63 checks at once, got {count}"):
            check.ranks_failing_each([True] * count)


def test_checks_that_pass_everywhere_take_one_small_all_reduce(monkeypatch) -> None:
    """The common case costs one single-element all_reduce and no all_gather; a failure on
    another rank alone (this rank passed everything) still names that rank."""
    world = ThreeRanks((0, 0))
    monkeypatch.setattr(check, "any_rank_nonzero", world.any_nonzero)
    monkeypatch.setattr(check, "gather_ints", world.gather)
    assert check.ranks_failing_each([True, True, True]) == ((), (), ())
    assert world.calls == [("all_reduce", 0)]
    world = ThreeRanks((0, 0b10))
    monkeypatch.setattr(check, "any_rank_nonzero", world.any_nonzero)
    monkeypatch.setattr(check, "gather_ints", world.gather)
    assert check.ranks_failing_each([True, True]) == ((), (2,))
    assert world.calls == [("all_reduce", 0), ("all_gather", 0)]


def _agree_on_two_ranks(rank: int, world: int, store: str) -> None:
    with gloo_group(rank, world, store):
        assert check.ranks_failing_each([True, True]) == ((), ())
        assert check.ranks_failing_each([True, rank == 0]) == ((), (1,))
        assert check.ranks_failing_each([False, True]) == ((0, 1), ())
        assert check.any_rank_nonzero(rank) and not check.any_rank_nonzero(0)


def test_agreement_on_a_real_gloo_group() -> None:
    spawn(_agree_on_two_ranks, world=2)


def _ranges_on_two_ranks(rank: int, world: int, store: str) -> None:
    with gloo_group(rank, world, store):
        big = 2**63 - 1
        assert check.int_ranges([rank, 7, -big, big - rank]) == (
            (0, 1),
            (7, 7),
            (-big, -big),
            (big - 1, big),
        )
        assert check.same_on_every_rank('["kimi", 96]')
        assert not check.same_on_every_rank('["kimi", 96]' if rank else '["kimi", 69]')
        assert not check.same_on_every_rank("x" * (1 + rank))
        assert not check.same_on_every_rank("" if rank else "\0")


def test_value_agreement_on_a_real_gloo_group() -> None:
    """Ranges and equality over two real ranks: one all_reduce each, exact for ints, and any
    difference in the data (a character, the length) seen by every rank."""
    spawn(_ranges_on_two_ranks, world=2)
