"""harness.bench.results and report: rank samples -> results -> JSON schema and tables."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from harness.bench.discovery_bench import DiscoveryResult
from harness.bench.launch_bench import MB, LaunchResult, read_probes
from harness.bench.report import BenchReport, evaluate_targets, print_report, write_report
from harness.bench.results import capture_overhead, transport_results
from harness.bench.stats import ratio_of_medians, summarize
from harness.errors import UsageError

MS = 1e-3


def _case(strategy: str, batch: int, raw: dict[str, list[float]], ours: dict[str, list[float]]):
    raw_bytes = {"ag_queries": {"send": 6912 * batch, "recv": 6912 * batch * 2}}
    if strategy == "ag_rs":
        raw_bytes["ag_lse"] = {"send": 384 * batch, "recv": 768 * batch}
        raw_bytes["rs_outputs"] = {"send": 196608 * batch, "recv": 98304 * batch}
    else:
        raw_bytes["a2a_outputs"] = {"send": 100000 * batch, "recv": 100000 * batch}
    return {
        "strategy": strategy,
        "reduce_scatter": "native",
        "batch": batch,
        "bytes": raw_bytes,
        "samples": {"raw": raw, "ours": ours},
    }


def raw_payload() -> dict[str, Any]:
    """Two ranks, two iterations; rank 1 is the slow one in iteration 0, rank 0 in iteration 1."""
    rank0 = {
        "transport": [
            _case(
                "ag_rs",
                8,
                raw={
                    "ag_queries": [1 * MS, 2 * MS],
                    "ag_lse": [1 * MS, 1 * MS],
                    "rs_outputs": [2 * MS, 3 * MS],
                },
                ours={"gather": [2 * MS, 3 * MS], "reduce": [4 * MS, 5 * MS]},
            ),
            _case(
                "a2a",
                8,
                raw={"ag_queries": [1 * MS, 1 * MS], "a2a_outputs": [1 * MS, 1 * MS]},
                ours={"gather": [1 * MS, 1 * MS], "reduce": [1 * MS, 1 * MS]},
            ),
        ],
        "capture": {
            "strategy": "ag_rs",
            "batch": 8,
            "unavailable": None,
            "step": {
                "plain": [10 * MS, 10 * MS],
                "after_window": [10 * MS, 11 * MS],
                "noop_subscriber": [12 * MS, 12 * MS],
            },
            "lookup": {
                "plain": [2e-7, 2e-7],
                "after_window": [2e-7, 2e-7],
                "noop_subscriber": [2e-7, 2e-7],
            },
        },
    }
    rank1 = json.loads(json.dumps(rank0))
    rank1["transport"][0]["samples"]["raw"]["ag_queries"] = [3 * MS, 1 * MS]
    rank1["transport"][0]["samples"]["ours"]["gather"] = [4 * MS, 1 * MS]
    return {
        "schema": "dcpqual-bench-rank/v1",
        "backend": "gloo",
        "world_size": 2,
        "device": "cpu",
        "device_name": "cpu",
        "ranks": [rank0, rank1],
    }


def test_transport_case_takes_slowest_rank_per_op_and_per_step() -> None:
    results = transport_results(raw_payload())
    ag_rs, a2a = results.cases
    assert (ag_rs.strategy, ag_rs.batch, ag_rs.world_size) == ("ag_rs", 8, 2)
    # ag_queries per iteration: max(1, 3) = 3 ms, max(2, 1) = 2 ms.
    assert ag_rs.ops_us["raw.ag_queries"].median == pytest.approx(2500.0)
    # raw step per rank: r0 [4, 6], r1 [6, 5] ms -> slowest [6, 6]; ours: r0 [6, 8], r1 [8, 6].
    assert ag_rs.raw_step_us.median == pytest.approx(6000.0)
    assert ag_rs.ours_step_us.median == pytest.approx(8000.0)
    assert ag_rs.ratio.value == pytest.approx(8 / 6)
    assert ag_rs.reduce_ratio.denominator_median == pytest.approx(3500.0)  # lse + rs: [3, 4]
    assert a2a.ratio.value == pytest.approx(1.0)
    assert results.worst is ag_rs
    ops = {b.op for b in ag_rs.bandwidth}
    assert ops == {"raw.ag_queries", "raw.ag_lse", "raw.rs_outputs", "ours.step", "raw.step"}


def test_transport_results_refuse_mismatched_ranks() -> None:
    payload = raw_payload()
    payload["world_size"] = 3
    with pytest.raises(UsageError, match="2 ranks for world size 3"):
        transport_results(payload)
    payload = raw_payload()
    payload["ranks"][1]["transport"].pop()
    with pytest.raises(UsageError, match="different numbers of cases"):
        transport_results(payload)


def test_capture_overhead_is_after_window_against_plain() -> None:
    cap = capture_overhead(raw_payload())
    assert cap.overhead_pct == pytest.approx(5.0)  # median 10.5 vs 10 ms
    assert set(cap.step_ratio) == {"after_window", "noop_subscriber"}
    assert cap.step_ratio["noop_subscriber"].value == pytest.approx(1.2)
    assert cap.lookup_ratio["after_window"].value == pytest.approx(1.0)


def launch_result(
    rss: dict[int, float], codes: tuple[int, ...] = (0,), models: str = "stand-in"
) -> LaunchResult:
    bare, suite = summarize([10.0, 12.0]), summarize([30.0])
    peak = max(rss.values()) if rss else None
    return LaunchResult(
        world_size=2,
        backend="gloo",
        models=models,
        bare_launch_s=None if models == "real" else bare,
        full_suite_s=suite,
        ratio=None if models == "real" else ratio_of_medians(suite, bare),
        suite_exit_codes=codes,
        peak_rss_mb_per_rank={str(k): v for k, v in rss.items()},
        peak_rss_mb=peak,
        peak_rss_gib=None if peak is None else peak * MB / 2**30,
        cpu_s_per_rank={str(k): 1.0 for k in rss},
        profile=None,
    )


def discovery_result() -> DiscoveryResult:
    seconds = summarize([0.3, 0.31])
    return DiscoveryResult(
        "kimi-k3", 16, 16, 16668, 100012, 116683, 1, seconds, seconds.scaled(1e6 / 100012),
        seconds.scaled(1e6 / 116683),
    )  # fmt: skip


def full_report(**overrides: Any) -> BenchReport:
    raw = raw_payload()
    fields: dict[str, Any] = {
        "created_at": "2026-01-01T00:00:00+00:00",
        "environment": {"host": "test"},
        "options": {"nproc": 2},
        "transport": transport_results(raw),
        "capture": capture_overhead(raw),
        "discovery": discovery_result(),
        "launch": launch_result({0: 390.0, 1: 410.5}),
        "real": launch_result({0: 1100.0, 1: 1400.0}, models="real"),
    }
    fields.update(overrides)
    return BenchReport(**fields)


def test_targets_one_per_issue_item_with_outcomes() -> None:
    targets = {t.target.key: t for t in evaluate_targets(full_report())}
    assert targets["transport_overhead"].outcome == "miss"
    assert targets["transport_overhead"].measured == pytest.approx(8 / 6)
    assert "ag_rs B=8" in targets["transport_overhead"].detail
    assert targets["suite_vs_bare_launch"].outcome == "miss"  # 30 / 11
    assert targets["discovery_us_per_module"].outcome == "pass"
    assert targets["capture_overhead_outside_window"].outcome == "miss"  # +5%
    mem = targets["peak_rss_per_rank"]
    assert mem.outcome == "miss" and mem.measured == pytest.approx(410.5)
    assert "rank 1" in mem.detail
    real = targets["peak_rss_per_rank_real"]
    assert real.outcome == "miss" and real.measured == pytest.approx(1400e6 / 2**30)
    assert "real" in real.detail and "rank 1" in real.detail


def test_missing_sections_are_not_measured_with_the_reason() -> None:
    report = full_report(
        transport=None,
        capture=None,
        launch=None,
        real=None,
        why_missing={"transport": "skipped (--skip transport)", "launch": "failed: boom"},
    )
    targets = {t.target.key: t for t in report.targets}
    assert targets["transport_overhead"].outcome == "not-measured"
    assert targets["transport_overhead"].detail == "skipped (--skip transport)"
    assert targets["suite_vs_bare_launch"].detail == "failed: boom"
    assert targets["peak_rss_per_rank"].detail == "failed: boom"
    assert targets["peak_rss_per_rank_real"].outcome == "not-measured"
    assert targets["discovery_us_per_module"].outcome == "pass"
    assert not report.complete  # a failed section
    assert full_report(transport=None, why_missing={"transport": "skipped (x)"}).complete


def test_a_failing_suite_run_makes_the_report_incomplete() -> None:
    assert not full_report(launch=launch_result({0: 1.0}, codes=(1,))).complete
    assert not full_report(real=launch_result({0: 1.0}, codes=(1,), models="real")).complete


def test_json_schema_v1(tmp_path: Path) -> None:
    path = tmp_path / "out" / "bench.json"
    write_report(full_report(notes=("n",)), path)
    data = json.loads(path.read_text())
    assert data["schema"] == "dcpqual-bench/v1"
    assert set(data) >= {"created_at", "environment", "options", "results", "targets", "notes"}
    assert set(data["results"]) == {"transport", "capture", "discovery", "launch", "real"}
    case = data["results"]["transport"]["cases"][0]
    assert case["ours_step_us"]["median"] == pytest.approx(8000.0)
    assert set(case["ours_step_us"]) >= {"median", "p10", "p90", "q1", "q3", "iqr"}
    assert case["ratio"]["paired"]["median"] == pytest.approx(8 / 6)
    assert data["results"]["capture"]["overhead_pct"] == pytest.approx(5.0)
    launch = data["results"]["launch"]
    assert launch["peak_rss_mb_per_rank"] == {"0": 390.0, "1": 410.5}
    assert launch["peak_rss_mb"] == 410.5 and launch["bare_launch_s"]["median"] == 11.0
    assert launch["ratio"]["value"] == pytest.approx(30 / 11)
    assert data["results"]["real"]["models"] == "real"
    assert data["results"]["discovery"]["tp"] == 16
    keys = [t["key"] for t in data["targets"]]
    assert keys[0] == "transport_overhead" and len(keys) == 6
    assert all(t["outcome"] in ("pass", "miss", "not-measured") for t in data["targets"])
    assert data["complete"] is True and data["notes"] == ["n"]


def test_results_are_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text("{}")
    with pytest.raises(UsageError, match="never overwritten"):
        write_report(full_report(), path)
    assert path.read_text() == "{}"


def test_printed_tables_show_cases_ratios_and_outcomes() -> None:
    out = io.StringIO()
    print_report(full_report(notes=("quick",)), out)
    text = out.getvalue()
    for needle in ("ag_rs B=8", "a2a B=8", "1.33", "transport_overhead", "miss", "pass"):
        assert needle in text
    assert "note: quick" in text


def test_read_probes_reads_every_rank_file(tmp_path: Path) -> None:
    for rank in (1, 0):
        (tmp_path / f"rank-{rank:02d}.json").write_text(json.dumps({"rank": rank}))
    (tmp_path / "rank-02.tmp").write_text("{")  # a half-written file is not read
    assert [p["rank"] for p in read_probes(tmp_path)] == [0, 1]
