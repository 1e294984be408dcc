"""The bench's statistics and targets (harness.bench.report): the arithmetic its numbers rest on."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from harness.bench.report import (
    CAPTURE,
    PCIE_GEN5_X16_BYTES_PER_S,
    REAL_MEMORY,
    TARGETS,
    TRANSPORT,
    bandwidth,
    bus_bytes,
    paired_ratio,
    ratio_of_medians,
    summarize,
)
from harness.errors import UsageError
from harness.schema.bench import TargetResult


def test_summarize_median_spread_and_range() -> None:
    s = summarize([1, 2, 3, 4, 100])
    assert (s.n, s.median, s.min, s.max) == (5, 3.0, 1.0, 100.0)
    assert (s.q1, s.q3, s.iqr) == (2.0, 4.0, 2.0)
    assert s.p10 == pytest.approx(1.4)  # linear interpolation between order statistics
    assert s.p90 == pytest.approx(61.6)
    assert all(type(v) in (int, float) for v in vars(s).values())  # JSON-ready, no numpy scalars


def test_summary_scaled_keeps_n_and_scales_the_rest() -> None:
    us = summarize([1e-6, 2e-6, 4e-6], 1e6)
    assert us.n == 3 and us.median == pytest.approx(2.0) and us.max == pytest.approx(4.0)
    assert us.iqr == pytest.approx(us.q3 - us.q1)


@pytest.mark.parametrize("bad", [[], [1.0, math.nan], [math.inf]])
def test_summarize_refuses_empty_or_non_finite(bad: list[float]) -> None:
    with pytest.raises(UsageError):
        summarize(bad)


def test_ratio_of_medians() -> None:
    r = ratio_of_medians(summarize([2, 4, 6]), summarize([1, 2, 3]))
    assert (r.value, r.numerator_median, r.denominator_median, r.paired) == (2.0, 4.0, 2.0, None)
    with pytest.raises(UsageError, match="nothing to divide"):
        ratio_of_medians(summarize([1.0]), summarize([0.0]))


def test_paired_ratio_summarizes_per_iteration_ratios() -> None:
    r = paired_ratio([2.0, 3.0, 12.0], [1.0, 2.0, 4.0])
    assert r.value == pytest.approx(3.0 / 2.0)  # ratio of medians
    assert r.paired is not None
    assert r.paired.median == pytest.approx(2.0)  # per-iteration: 2, 1.5, 3
    assert (r.paired.min, r.paired.max) == (1.5, 3.0)
    with pytest.raises(UsageError, match="differ in length"):
        paired_ratio([1.0], [1.0, 2.0])
    with pytest.raises(UsageError, match="<= 0"):
        paired_ratio([1.0], [0.0])


def test_bus_bytes_follow_nccl_tests() -> None:
    assert bus_bytes(160, world=16) == pytest.approx(150.0)  # size x (n-1)/n
    assert bus_bytes(160, world=1) == 0.0
    with pytest.raises(UsageError):
        bus_bytes(1, world=0)


def test_bandwidth_against_pcie_gen5_x16() -> None:
    bw = bandwidth("raw.ag_queries", PCIE_GEN5_X16_BYTES_PER_S / 2, 1.0)
    assert bw.busbw_gb_s == pytest.approx(32.0)
    assert bw.pcie_gen5_x16_fraction == pytest.approx(0.5)
    with pytest.raises(UsageError):
        bandwidth("x", 1.0, 0.0)


def test_targets_are_the_nine_bounds() -> None:
    assert [(t.key, t.threshold, t.unit) for t in TARGETS] == [
        ("transport_overhead", 1.15, "x"),
        ("suite_vs_bare_launch", 2.0, "x"),
        ("discovery_us_per_module", 10.0, "us"),
        ("capture_overhead_outside_window", 2.0, "%"),
        ("peak_rss_per_rank", 400.0, "MB"),
        ("peak_rss_per_rank_real", 1.2, "GiB"),
        ("real_vs_bare_real_launch", 1.5, "x"),
        ("engine_run_s", 90.0, "s"),
        ("peak_rss_per_rank_engine", 1.5, "GiB"),
    ]


def test_evaluate_pass_miss_and_not_measured() -> None:
    passed = TRANSPORT.evaluate(1.15)  # the bound itself passes
    assert (passed.outcome, passed.excess, passed.key, passed.unit) == (
        "pass", None, "transport_overhead", "x",
    )  # fmt: skip
    miss = TRANSPORT.evaluate(1.38, "worst a2a B=64")
    assert miss.outcome == "miss" and miss.excess == pytest.approx(0.2)
    assert miss.detail == "worst a2a B=64" and miss.threshold == 1.15
    assert CAPTURE.evaluate(-0.5).outcome == "pass"  # faster than baseline: noise, a pass
    assert REAL_MEMORY.evaluate(1.3).outcome == "miss"
    skipped = CAPTURE.evaluate(None, "skipped (--skip capture)")
    assert skipped.outcome == "not-measured" and skipped.excess is None
    assert skipped.measured is None and skipped.detail == "skipped (--skip capture)"


def test_a_target_result_must_be_consistent() -> None:
    good = TRANSPORT.evaluate(2.0).model_dump()
    for bad in ({"outcome": "pass"}, {"measured": None}, {"outcome": "maybe"},
                {"outcome": "not-measured"}, {"threshold": 0.0}):  # fmt: skip
        with pytest.raises(ValidationError):
            TargetResult.model_validate({**good, **bad})
