"""The bench's launching and rank side: a dead rank is named, ranks leave together, phases add."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import TypeAdapter

from harness.bench import bare_rank, bare_real_rank, launching, probe, ranks
from harness.bench.launching import dead_ranks, profile_of, read_probes, why_failed
from harness.errors import QualificationError
from harness.launch.agent import STARTED_COLD
from harness.launch.plan import RunOptions, rank_plan
from harness.models.real import RealSpec, planned_spec
from harness.rank.forkserver_preload import READY
from harness.rank.preload import PRELOAD, preload_for
from harness.schema.bench import BenchOptions, ProbePhases, ProbeRecord
from harness.schema.plan import RankPlan
from harness.schema.rank_record import RankRecord, RealTreeRecord

# torchrun 2.13's report after rank 1 aborted and the agent ended rank 0.
AGENT_LOG = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
harness.bench.rank FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_11:37:55
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 24222)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 24222
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_11:37:55
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 24223)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 24223
=======================================================
"""


def fake_launch(tmp_path: Path, agent: str, stderr: dict[int, str]) -> Path:
    node = tmp_path / "torchrun" / "node-00"
    node.mkdir(parents=True)
    (node / "agent.log").write_text(agent)
    for local, text in stderr.items():
        folder = node / "run_x" / "attempt_0" / str(local)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(text)
    return tmp_path


def test_dead_ranks_root_cause_first() -> None:
    assert dead_ranks(AGENT_LOG) == [(1, 1, -6), (0, 0, -15)]
    assert dead_ranks("torchrun exited") == []


def test_a_dead_rank_is_named_with_its_signal_and_stderr(tmp_path: Path) -> None:
    out = fake_launch(
        tmp_path, AGENT_LOG, {0: "", 1: "x\nterminate called without an active exception\n"}
    )
    text = why_failed(out, 1, world=2)
    assert text.startswith("bench rank 1 of 2 died first (exit -6 (SIGABRT); torchrun exit 1)")
    assert "then rank 0 exit -15 (SIGTERM)" in text
    assert text.endswith("terminate called without an active exception")


def test_without_torchruns_report_the_first_rank_stderr_is_shown(tmp_path: Path) -> None:
    out = fake_launch(tmp_path, "Traceback: agent broke", {0: "", 1: "boom"})
    text = why_failed(out, 1, world=2)
    assert "no failed rank in its report" in text and text.endswith("boom")


class Exited(Exception):
    """What the fake `exit_now` raises: a bench rank never returns from leaving."""


class FakeGroup:
    """Stands in for torch.distributed and the bootstrap: records the order of calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, me: int, fail: bool = False) -> None:
        self.calls: list[str] = []
        env = bare_rank.RankEnv(rank=me, world_size=2)
        monkeypatch.setattr(bare_rank.RankEnv, "from_env", staticmethod(lambda: env))
        monkeypatch.setattr(bare_rank, "init_process_group", lambda *a: self._note("init", "cpu"))
        monkeypatch.setattr(bare_rank, "teardown", lambda: self._note("teardown"))
        monkeypatch.setattr(bare_rank.dist, "barrier", lambda **kw: self._note("barrier"))
        monkeypatch.setattr(ranks, "atomic_write_text", lambda *a: self._note("write"))

        def leave(code: int) -> None:
            self._note(f"exit {code}")
            raise Exited(code)

        monkeypatch.setattr(ranks, "exit_now", leave)

        def measure(clock: Any, options: Any) -> Any:
            self._note("measure")
            if fail:
                raise RuntimeError("measurement broke")
            return []

        monkeypatch.setattr(ranks, "measure_transport", measure)
        monkeypatch.setattr(ranks, "measure_capture", lambda *a: self._note("capture"))

    def _note(self, what: str, value: Any = None) -> Any:
        self.calls.append(what)
        return torch.device(value) if value else None

    def run(self, main: Any, *argv: str) -> None:
        with pytest.raises(Exited):
            main(list(argv))


OPTIONS = BenchOptions(out=Path("/nonexistent/bench.json")).model_dump_json()


@pytest.mark.parametrize(
    ("me", "expected"),
    [
        (0, ["init", "measure", "capture", "write", "barrier", "teardown", "exit 0"]),
        (1, ["init", "measure", "capture", "barrier", "teardown", "exit 0"]),
    ],
)
def test_every_rank_waits_for_rank_0s_write_then_all_leave(
    monkeypatch: pytest.MonkeyPatch, me: int, expected: list[str]
) -> None:
    group = FakeGroup(monkeypatch, me)
    group.run(ranks.main, OPTIONS, "/nonexistent/out.json")
    assert group.calls == expected


def test_a_failing_rank_prints_why_leaves_the_group_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    group = FakeGroup(monkeypatch, 1, fail=True)
    group.run(ranks.main, OPTIONS, "/nonexistent/out.json")
    assert group.calls == ["init", "measure", "teardown", "exit 1"]
    assert "RuntimeError: measurement broke" in capsys.readouterr().err


def test_a_rank_that_cannot_join_says_why_in_one_line_and_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    group = FakeGroup(monkeypatch, 0)

    def refuse(*args: Any) -> None:
        raise bare_rank.BootstrapError("backend nccl needs CUDA")

    monkeypatch.setattr(bare_rank, "init_process_group", refuse)
    group.run(ranks.main, OPTIONS, "/nonexistent/out.json")
    assert group.calls == ["exit 3"]
    assert capsys.readouterr().err.strip() == "harness.bench.ranks: backend nccl needs CUDA"


def test_probe_splits_each_test_into_body_and_overhead(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 1.0, 3.0, 3.5, 4.0, 10.0])  # protocol 0..10; call 1..3; a write 3.5..4
    cpu = iter([0.0, 0.25, 1.0, 1.25, 1.5, 2.0])  # the main thread's CPU at the same moments

    monkeypatch.setattr(probe.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(probe.time, "thread_time", lambda: next(cpu))
    phases = probe.Phases()
    write = phases._timer("records_s", lambda: None)

    class Item:
        nodeid = "suites/transport/test_gather.py::test_x[1]"

    phases.before("pytest_runtest_protocol", [], {"item": Item()})
    phases.before("pytest_runtest_call", [], {})
    phases.after(None, "pytest_runtest_call", [], {})
    write()
    phases.after(None, "pytest_runtest_protocol", [], {})
    suite = phases.result().suites["transport"]
    assert suite == {
        "tests": 1, "tests_s": 2.0, "overhead_s": 8.0, "records_s": 0.5,
        "tests_cpu_s": 0.75, "overhead_cpu_s": 1.25, "records_cpu_s": 0.25,
    }  # fmt: skip


def test_probe_names_what_it_could_not_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "TIMED", {"agreement_s": ("harness.rank.sidechannel:Gone.post",)})
    phases = probe.Phases()
    phases.wrap()
    assert phases.unprobed == ["harness.rank.sidechannel:Gone.post"]


def test_probe_writes_one_record_per_rank_that_the_driver_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(probe.ENV_DIR, str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    probe.pytest_unconfigure(None)  # type: ignore[arg-type]
    (tmp_path / ".rank-04.json.x.tmp").write_text("{")  # a half-written file is not read
    (found,) = read_probes(tmp_path)
    assert (found.rank, found.pid, found.phases) == (3, os.getpid(), None)
    assert found.ru_maxrss_kib > 0 and found.cpu_s > 0


def _probe(rank: int, configure: float) -> ProbeRecord:
    phases = ProbePhases(import_torch=2.0, configure=configure, collection=1.0, finish=0.5,
                         suites={"capture": {"tests": 3, "tests_s": 4.0}}, unprobed=())  # fmt: skip
    return ProbeRecord(rank=rank, pid=1, ru_maxrss_kib=1, cpu_s=10.0, loaded_at=100.0 + rank,
                       ended_at=150.0 + rank, phases=phases)  # fmt: skip


def test_profile_takes_median_and_slowest_rank_and_the_launchers_share() -> None:
    prof = profile_of([_probe(0, 1.0), _probe(1, 3.0), _probe(2, 8.0)], 90.0, 160.0)
    assert prof is not None
    assert prof.phases_s["configure"].model_dump() == {"median": 3.0, "max": 8.0}
    assert prof.phases_s["suite capture (3 tests): tests_s"].model_dump() == {
        "median": 4.0, "max": 4.0,
    }  # fmt: skip
    assert "suite capture (3 tests): tests" not in prof.phases_s  # a count, not a phase
    assert (prof.launcher_before_ranks_s, prof.ranks_s, prof.launcher_after_ranks_s) == (
        10.0, 52.0, 8.0,
    )  # fmt: skip
    assert prof.cpu_s_all_ranks == 30.0
    unprofiled = _probe(0, 1.0).model_copy(update={"phases": None})
    assert profile_of([unprofiled], 0.0, 1.0) is None  # not profiled: no table


def _tree(rank: int, import_s: float, build_s: float, **config: Any) -> dict[str, Any]:
    """One rank's real-tree record, as the run's rank records and the bare ranks hold it."""
    tree = {"model": "kimi-k3", "tp": 4, "dcp": 4, "kv_cache_dtype": "auto",
            "dcp_comm_backend": "ag_rs", "classes": ("vllm.X",), "import_s": import_s,
            "build_s": build_s}  # fmt: skip
    return {**tree, **config}


def _run_records(folder: Path, trees: list[dict[str, Any]]) -> None:
    records = folder / "suite-0" / "bundle" / "records"
    records.mkdir(parents=True)
    for rank, tree in enumerate(trees):
        record = RankRecord(rank=rank, world_size=len(trees), extra={"real_trees": [tree]})
        (records / f"rank-{rank:02d}.json").write_text(json.dumps(record.to_json()))


def test_bare_launches_alternate_with_full_runs_and_the_real_trees_run_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[object, ...]] = []
    rss = iter([300_000, 400_000, 350_000, 100_000])  # KiB: rank 0 and 1, run 1 then run 2
    bare_trees: list[dict[str, Any]] = []
    plans: list[RankPlan | None] = []
    preloads: list[tuple[str, ...] | None] = []

    def bare(
        nproc: int,
        backend: str,
        out: Path,
        module: Any,
        timeout: float,
        start: str = "cold",
        preload: tuple[str, ...] = PRELOAD,
        extra_env: dict[str, str] | None = None,
    ) -> float:
        forked = start == "forkserver"
        calls.append(("bare" if start == "cold" else f"bare-{start}", nproc, module[0]))
        if module[0] == "harness.bench.bare_real_rank":  # its ranks write their trees
            plans.append(RankPlan.from_environ(extra_env or {}))
            preloads.append(preload if forked else None)
            for rank, tree in enumerate(bare_trees):
                record = TypeAdapter(RealTreeRecord).validate_python(tree)
                path = bare_real_rank.record_path(Path(module[3]), rank)
                path.write_bytes(TypeAdapter(RealTreeRecord).dump_json(record))
            return 12.0 if forked else 25.0
        return {"cold": 10.0, "forkserver": 5.0}[start]

    def full(options: BenchOptions, nproc: int, models: str, work: Path) -> Any:
        calls.append(("full", nproc, models))
        probes = [_probe(r, 1.0).model_copy(update={"ru_maxrss_kib": next(rss)}) for r in (0, 1)]
        return launching.FullRun(30.0, 0, probes, None)

    monkeypatch.setattr(launching, "run_ranks", bare)
    monkeypatch.setattr(launching, "full_run", full)
    options = BenchOptions(out=tmp_path / "b.json", nproc=2, real_nproc=4, suite_repeats=2)
    runs = launching.measure_runs(options, "stand-in", tmp_path, say=lambda line: None)
    bare_pair = [
        ("bare", 2, "harness.bench.bare_rank"),
        ("bare-forkserver", 2, "harness.bench.bare_rank"),
    ]
    assert calls == [*bare_pair, ("full", 2, "stand-in")] * 2 + bare_pair
    assert runs.ratio is not None and runs.ratio.value == pytest.approx(3.0)  # the target's
    # Beside it, the same bare launch with its ranks started as the run's are (torchelastic's
    # agent, forked by multiprocessing's forkserver), and full / that.
    assert runs.bare_forkserver_launch_s is not None
    assert runs.bare_forkserver_launch_s.median == 5.0
    assert runs.ratio_to_forkserver_launch is not None
    assert runs.ratio_to_forkserver_launch.value == pytest.approx(6.0)
    # Each rank's peak over both runs, in MB of 1e6 bytes.
    assert runs.peak_rss_mb_per_rank == {"0": 350_000 * 1024 / 1e6, "1": 400_000 * 1024 / 1e6}
    assert runs.peak_rss_mb == pytest.approx(409.6)
    assert runs.real_import_s is None and runs.real_build_s is None  # stand-ins: no vLLM
    assert runs.bare_real_import_s is None and runs.forkserver_preload_s is None
    calls.clear()
    rss = iter([1_000_000, 900_000])
    # What each rank's record says its vLLM import and build cost: the run's ranks found vLLM
    # preloaded, the bare launch's imported it themselves.
    _run_records(tmp_path, [_tree(rank, 0.01 * rank, 2.0 * rank) for rank in range(4)])
    bare_trees[:] = [_tree(rank, 20.0 + rank, 1.0 + rank) for rank in range(4)]
    node = tmp_path / "suite-0" / "bundle" / "torchrun" / "node-00"
    node.mkdir(parents=True)
    (node / "agent.log").write_text(
        "Triton is installed\ndcpqual forkserver: 26 modules preloaded in 15.7s\n"
    )
    real = launching.measure_runs(options, "real", tmp_path, say=lambda line: None)
    # One cold bare real-tree launch, the same through a forkserver that preloaded vLLM as the
    # run's does, then one run, all at --real-nproc-per-node.
    assert calls == [
        ("bare", 4, "harness.bench.bare_real_rank"),
        ("bare-forkserver", 4, "harness.bench.bare_real_rank"),
        ("full", 4, "real"),
    ]
    real_plan = RunOptions(nproc_per_node=4, models="real")
    assert plans == [
        rank_plan(real_plan, tmp_path / "bare-real"),
        rank_plan(real_plan, tmp_path / "bare-real-forkserver"),
    ]
    assert preloads == [None, preload_for("real")]
    assert real.models == "real" and real.bare_launch_s is not None
    # The target stays against the cold launch; the forkserver's is information beside it.
    assert real.ratio is not None and real.ratio.value == pytest.approx(30.0 / 25.0)
    assert real.bare_forkserver_launch_s is not None
    assert real.bare_forkserver_launch_s.median == 12.0
    assert real.ratio_to_forkserver_launch is not None
    assert real.ratio_to_forkserver_launch.value == pytest.approx(30.0 / 12.0)
    assert real.real_import_s is not None and real.real_build_s is not None
    assert (real.real_import_s.median, real.real_import_s.max) == (0.015, 0.03)
    assert (real.real_build_s.median, real.real_build_s.max) == (3.0, 6.0)
    assert real.bare_real_import_s is not None and real.bare_real_build_s is not None
    assert (real.bare_real_import_s.median, real.bare_real_build_s.max) == (21.5, 4.0)
    assert real.forkserver_preload_s == 15.7
    assert real.real_trees == ("kimi-k3 tp=4 dcp=4 kv=auto ag_rs",)


@pytest.mark.parametrize(
    ("bare", "said"),
    [
        ([_tree(r, 1.0, 1.0, dcp=2) for r in range(4)], "kimi-k3 tp=4 dcp=2 kv=auto ag_rs"),
        ([_tree(r, 1.0, 1.0, classes=("vllm.Y",)) for r in range(4)], "on 4 of 4 ranks"),
        ([_tree(r, 1.0, 1.0) for r in range(3)], "on 3 of 4 ranks"),
    ],
    ids=["other-dcp", "other-classes", "a-rank-built-nothing"],
)
def test_no_ratio_against_a_bare_launch_that_built_other_trees(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, bare: list[dict[str, Any]], said: str
) -> None:
    adapter = TypeAdapter(RealTreeRecord)
    run = [adapter.validate_python(_tree(r, 0.0, 1.0)) for r in range(4)]
    launching.same_trees(run, [adapter.validate_python(t) for t in run_like(run)], 4)  # same
    with pytest.raises(QualificationError, match="no ratio between different work") as caught:
        launching.same_trees(run, [adapter.validate_python(t) for t in bare], 4)
    assert said in str(caught.value)


def run_like(run: list[RealTreeRecord]) -> list[dict[str, Any]]:
    """The same trees at another cost: what a bare launch of the same work records."""
    return [_tree(r, 30.0, 9.0) for r in range(len(run))]


def test_the_forkservers_preload_seconds_come_from_its_line_on_the_agents_log(
    tmp_path: Path,
) -> None:
    assert launching.forkserver_preload_s(tmp_path) is None  # no agent log (one rank)
    node = tmp_path / "torchrun" / "node-00"
    node.mkdir(parents=True)
    said = READY.format(count=12, seconds=41.26)
    (node / "agent.log").write_text(f"Triton is installed\n{said}\n")
    assert launching.forkserver_preload_s(tmp_path) == 41.3  # as the forkserver prints it
    (node / "agent.log").write_text(f"{said}\n{STARTED_COLD}3 threads alive\n")
    assert launching.forkserver_preload_s(tmp_path) is None  # the ranks started cold


def test_the_bare_real_rank_builds_the_runs_configuration_and_records_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    built: list[RealSpec] = []

    class Tree:
        def __init__(self, spec: RealSpec) -> None:
            self.spec = spec

        def record(self) -> RealTreeRecord:
            config = {k: getattr(self.spec, k) for k in ("model", "tp", "dcp", "kv_cache_dtype")}
            return RealTreeRecord(
                **config, dcp_comm_backend=self.spec.dcp_comm_backend, import_s=3.0, build_s=1.0
            )

    def build(spec: RealSpec) -> Tree:
        built.append(spec)
        return Tree(spec)

    monkeypatch.setattr(bare_real_rank, "build_real", build)
    plan = RankPlan(models="real", dcp=2, dcp_comm_backend="a2a", real_model="deepseek-v3")
    work = bare_real_rank.build_trees(tmp_path, plan)
    work(bare_rank.RankEnv(rank=3, world_size=4), torch.device("cpu"))
    assert built == [planned_spec(plan, 4)]  # the real suites' own configuration
    assert built[0] == RealSpec("deepseek-v3", tp=4, dcp=2, dcp_comm_backend="a2a")
    (found,) = bare_real_rank.read_records(tmp_path)
    assert bare_real_rank.record_path(tmp_path, 3).is_file()
    assert (found.model, found.dcp, found.import_s, found.build_s) == ("deepseek-v3", 2, 3.0, 1.0)


def test_slowest_is_each_series_maximum_over_ranks_per_iteration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    peer = {"raw.b": [5.0, 0.0], "ours.a": [0.0, 7.0]}  # the other rank's series

    def all_reduce(tensor: torch.Tensor, op: Any) -> None:
        assert op == torch.distributed.ReduceOp.MAX
        other = torch.tensor([peer[name] for name in sorted(peer)], dtype=tensor.dtype)
        tensor.copy_(torch.maximum(tensor, other))

    monkeypatch.setattr(ranks.dist, "all_reduce", all_reduce)
    clock = ranks.Clock(0, 2, torch.device("cpu"))
    slow = clock.slowest({"ours.a": [1.0, 2.0], "raw.b": [3.0, 4.0]})
    assert {k: v.tolist() for k, v in slow.items()} == {"ours.a": [1.0, 7.0], "raw.b": [5.0, 4.0]}


def test_the_bare_launch_checks_its_one_all_reduce(monkeypatch: pytest.MonkeyPatch) -> None:
    env, cpu = bare_rank.RankEnv(rank=0, world_size=2), torch.device("cpu")
    monkeypatch.setattr(bare_rank.dist, "all_reduce", lambda t: t.mul_(2))  # 1 + 1 from a peer
    bare_rank.all_reduce_once(env, cpu)
    monkeypatch.setattr(bare_rank.dist, "all_reduce", lambda t: None)  # the peer's 1 is lost
    with pytest.raises(RuntimeError, match=r"all_reduce gave 1\.0, not 2"):
        bare_rank.all_reduce_once(env, cpu)


def test_the_bare_rank_imports_only_torch_and_the_bootstrap(repo_root: Path) -> None:
    """The bare launch is the baseline: every bench rank imports its module, never the other way
    round, so nothing the suites or the measurements need can enter its time."""
    code = "import sys, harness.bench.bare_rank; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, check=True
    )
    loaded = set(done.stdout.split())
    assert {m for m in loaded if m.startswith("harness")} == {
        "harness",
        "harness.bench",
        "harness.bench.bare_rank",
        "harness.rank",
        "harness.rank.bootstrap",
        "harness.rank.openfiles",  # the bootstrap's exit (standard library only)
    }
    assert "torch.distributed" in loaded and "pydantic" not in loaded


def _engine(build_s: float, eager_s: float, rss_mib: float) -> dict[str, Any]:
    """One rank's engine record as the engine lane writes it into the bundle."""
    return {"model": "deepseek-v3", "architecture": "DeepseekV3ForCausalLM",
            "vllm_version": "0.32.0", "vllm_path": "/v", "vllm_commit": None, "tp": 2, "dcp": 2,
            "build_s": build_s, "eager_build_s": eager_s, "peak_rss_mib": rss_mib}  # fmt: skip


def test_the_engine_row_is_one_timed_run_and_what_its_rank_records_hold(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[int, str]] = []
    engines = [_engine(7.5, 3.0, 2048.0), _engine(8.5, 3.5, 2560.0)]

    def full(options: BenchOptions, nproc: int, models: str, work: Path) -> Any:
        calls.append((nproc, models))
        (records := work / "bundle" / "records").mkdir(parents=True)
        for rank, engine in enumerate(engines):
            record = RankRecord(rank=rank, world_size=2, extra={"engine": engine})
            (records / f"rank-{rank:02d}.json").write_text(json.dumps(record.to_json()))
        return launching.FullRun(42.0, 0, [], None)

    monkeypatch.setattr(launching, "full_run", full)
    options = BenchOptions(out=tmp_path / "b.json", nproc=4)
    run = launching.measure_engine(options, tmp_path / "engine", say=lambda line: None)
    assert calls == [(2, "engine")]  # one launch, at the lane's two ranks, not --nproc
    assert (run.world_size, run.wall_s, run.exit_code) == (2, 42.0, 0)
    assert run.build_s_per_rank == {"0": 7.5, "1": 8.5}
    assert run.eager_build_s_per_rank == {"0": 3.0, "1": 3.5}
    assert run.peak_rss_mib_per_rank == {"0": 2048.0, "1": 2560.0}
    assert run.peak_rss_gib == pytest.approx(2.5) and run.models == ("deepseek-v3",)


def test_an_engine_run_whose_ranks_recorded_no_engine_has_no_rss(tmp_path: Path) -> None:
    (records := tmp_path / "records").mkdir()
    record = RankRecord(rank=0, world_size=2)
    (records / "rank-00.json").write_text(json.dumps(record.to_json()))
    run = launching.engine_run(50.0, 1, "gloo", tmp_path)
    assert run.peak_rss_gib is None and run.peak_rss_mib_per_rank == {} and run.exit_code == 1
