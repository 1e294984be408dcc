"""harness.bench.stats, bandwidth and targets: the arithmetic the bench's numbers rest on."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.bench.bandwidth import (
    PCIE_GEN5_X16_BYTES_PER_S,
    bandwidth,
    bus_bytes,
    collective_kind,
)
from harness.bench.stats import (
    Summary,
    elementwise_max,
    paired_ratio,
    quantile,
    ratio_of_medians,
    summarize,
)
from harness.bench.targets import CAPTURE, TARGETS, TRANSPORT, Target, TargetResult, evaluate
from harness.errors import UsageError


@pytest.mark.parametrize("q", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
@pytest.mark.parametrize("samples", [[3.0], [2.0, 1.0], [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 0.5]])
def test_quantile_matches_numpy_linear(samples: list[float], q: float) -> None:
    assert quantile(samples, q) == pytest.approx(float(np.quantile(samples, q)))


def test_summarize_median_spread_and_range() -> None:
    s = summarize([1, 2, 3, 4, 100])
    assert (s.n, s.median, s.min, s.max) == (5, 3.0, 1.0, 100.0)
    assert (s.q1, s.q3, s.iqr) == (2.0, 4.0, 2.0)
    assert s.p10 == pytest.approx(1.4)
    assert s.p90 == pytest.approx(61.6)
    assert s.rel_iqr == pytest.approx(2 / 3)


def test_summary_scaled_and_json_round_trip() -> None:
    s = summarize([1e-6, 2e-6, 3e-6])
    us = s.scaled(1e6)
    assert us.median == pytest.approx(2.0) and us.n == 3
    data = us.to_json()
    assert data["iqr"] == pytest.approx(us.iqr)
    assert Summary.from_json(data) == us


@pytest.mark.parametrize("bad", [[], [1.0, math.nan], [math.inf]])
def test_summarize_refuses_empty_or_non_finite(bad: list[float]) -> None:
    with pytest.raises(UsageError):
        summarize(bad)


def test_ratio_of_medians() -> None:
    r = ratio_of_medians(summarize([2, 4, 6]), summarize([1, 2, 3]))
    assert r.value == 2.0 and r.paired is None
    assert r.to_json()["numerator_median"] == 4.0
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


def test_elementwise_max_takes_the_slowest_rank_per_iteration() -> None:
    assert elementwise_max([[1, 5, 2], [3, 1, 2]]) == [3, 5, 2]
    with pytest.raises(UsageError, match="different iteration counts"):
        elementwise_max([[1, 2], [1]])
    with pytest.raises(UsageError):
        elementwise_max([])


def test_bus_bytes_follow_nccl_tests() -> None:
    assert collective_kind("ag_queries") == "all_gather"
    assert collective_kind("rs_outputs") == "reduce_scatter"
    assert collective_kind("a2a_outputs") == "all_to_all"
    # all-gather counts the gathered output, the others what is sent; times (n-1)/n.
    assert bus_bytes("all_gather", send=10, recv=160, world=16) == pytest.approx(150.0)
    assert bus_bytes("reduce_scatter", send=160, recv=10, world=16) == pytest.approx(150.0)
    assert bus_bytes("all_to_all", send=160, recv=160, world=16) == pytest.approx(150.0)
    with pytest.raises(UsageError):
        collective_kind("barrier")


def test_bandwidth_against_pcie_gen5_x16() -> None:
    bw = bandwidth("raw.ag_queries", PCIE_GEN5_X16_BYTES_PER_S / 2, 1.0)
    assert bw.busbw_gb_s == pytest.approx(32.0)
    assert bw.pcie_gen5_x16_fraction == pytest.approx(0.5)
    with pytest.raises(UsageError):
        bandwidth("x", 1.0, 0.0)


def test_targets_are_the_issues_five() -> None:
    assert [(t.key, t.threshold, t.unit) for t in TARGETS] == [
        ("transport_overhead", 1.15, "x"),
        ("suite_vs_bare_launch", 2.0, "x"),
        ("discovery_us_per_module", 10.0, "us"),
        ("capture_overhead_outside_window", 2.0, "%"),
        ("peak_rss_per_rank", 400.0, "MB"),
    ]


def test_evaluate_pass_miss_and_not_measured() -> None:
    assert evaluate(TRANSPORT, 1.15).outcome == "pass"  # the bound itself passes
    miss = evaluate(TRANSPORT, 1.38, "worst a2a B=64")
    assert miss.outcome == "miss" and miss.excess == pytest.approx(0.2)
    assert miss.to_json()["excess"] == pytest.approx(0.2)
    assert evaluate(CAPTURE, -0.5).outcome == "pass"  # faster than baseline: noise, a pass
    skipped = evaluate(CAPTURE, None, "skipped (--skip capture)")
    assert skipped.outcome == "not-measured" and skipped.excess is None
    assert skipped.to_json()["detail"] == "skipped (--skip capture)"


def test_target_values_validate() -> None:
    with pytest.raises(UsageError):
        Target("x", "y", 0.0, "x")
    with pytest.raises(UsageError):
        TargetResult(TRANSPORT, "pass", None)
    with pytest.raises(UsageError):
        TargetResult(TRANSPORT, "not-measured", 1.0)
    with pytest.raises(UsageError):
        TargetResult(TRANSPORT, "maybe", 1.0)  # type: ignore[arg-type]
