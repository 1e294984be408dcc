"""Planning the torchrun command: pure, so every flag the ranks get is pinned here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.errors import GeometryError, UsageError
from harness.launch.plan import REPO_ROOT, RunOptions, build_plan
from harness.rank import preload
from harness.rank.preload import PRELOAD
from harness.schema.plan import PLAN_ENV, RankPlan

OUT = Path("/tmp/dcpqual-out")


def flag(argv: tuple[str, ...], name: str) -> str:
    [value] = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
    return value


def test_single_node_plan_runs_pytest_with_the_rank_plugin_once():
    plan = build_plan(RunOptions(nproc_per_node=16), OUT)
    argv = plan.argv
    assert argv[:3] == (sys.executable, "-m", "harness.launch.agent"), "torchelastic's agent"
    assert argv[3:6] == ("--preload", ",".join(PRELOAD), "--")
    assert "--standalone" in argv and not any(a.startswith("--rdzv") for a in argv)
    assert flag(argv, "--nproc-per-node") == "16"
    assert flag(argv, "--max-restarts") == "0"
    assert flag(argv, "--log-dir") == str(OUT / "torchrun" / "node-00")
    assert flag(argv, "--redirects") == "3"
    tail = argv[argv.index("-m", 3) :]
    plugins = (
        "-p",
        "harness.rank.outrelay",
        "-p",
        "harness.rank.heap",
        "-p",
        "harness.rank.plugin",
    )
    assert tail[:8] == ("-m", "pytest", *plugins)
    assert not any(a.startswith("--dcpqual") for a in tail), "settings travel in the plan"
    assert tail[-1] == str(REPO_ROOT / "suites")
    assert plan.targets == (str(REPO_ROOT / "suites"),)


@pytest.mark.parametrize("installed", [True, False], ids=["vllm", "no-vllm"])
def test_a_run_on_real_trees_preloads_vllm_in_the_forkserver_where_it_is_installed(
    monkeypatch: pytest.MonkeyPatch, installed: bool
) -> None:
    found = object() if installed else None
    monkeypatch.setattr(preload.importlib.util, "find_spec", lambda name: found)
    argv = build_plan(RunOptions(nproc_per_node=4, models="real"), OUT).argv
    listed = tuple(argv[4].split(","))
    assert argv[3] == "--preload" and listed[: len(PRELOAD)] == PRELOAD
    assert listed[len(PRELOAD) :] == (preload.REAL_TREE_PRELOAD if installed else ())


def test_every_rank_exits_fast_forkserver_or_cold():
    """Records and junit are final once pytest is done: the agent reads a forkserver rank's
    exit 0 (no return value handed back) as success, as torchrun reads a cold rank's."""
    many = RankPlan.from_environ(build_plan(RunOptions(nproc_per_node=4), OUT).env)
    one = RankPlan.from_environ(build_plan(RunOptions(nproc_per_node=1, tp=1), OUT).env)
    assert many is not None and many.fast_exit
    assert one is not None and one.fast_exit


def test_one_rank_is_execd_by_torchrun_without_a_forkserver():
    plan = build_plan(RunOptions(nproc_per_node=1, tp=1), OUT)
    assert plan.argv[:3] == (sys.executable, "-m", "torch.distributed.run")
    assert "harness.launch.agent" not in plan.argv
    assert plan.argv[plan.argv.index("-m", 3) :][:2] == ("-m", "pytest")


def test_plan_environment_reaches_the_ranks_and_suites():
    options = RunOptions(nproc_per_node=4, warm_impl="before-kimi", tp=16)
    env = build_plan(options, OUT).child_env({"PATH": "/bin", "HF_TOKEN": "x"})
    plan = RankPlan.from_environ(env)
    assert plan is not None and plan.out_dir == str(OUT) and plan.node_index == 0
    assert plan.warm_impl == "before-kimi"
    assert (plan.tp, plan.dcp) == (16, 4)
    assert plan.backend == "gloo"
    assert not [k for k in env if k.startswith("DCPQUAL_") and k != PLAN_ENV]
    assert env["TORCHELASTIC_ERROR_FILE"].startswith(str(OUT / "torchrun" / "node-00"))
    assert env["PATH"] == "/bin"
    assert env["PYTHONPATH"].split(":")[0] == str(REPO_ROOT)


def test_multi_node_plan_uses_c10d_rendezvous():
    options = RunOptions(
        nproc_per_node=8,
        nnodes=2,
        node_rank=1,
        rdzv_endpoint="127.0.0.1:29555",
        out_dir=OUT,
    )
    plan = build_plan(options, OUT)
    argv = plan.argv
    assert "--standalone" not in argv
    assert flag(argv, "--nnodes") == "2"
    assert flag(argv, "--node-rank") == "1"
    assert flag(argv, "--rdzv-backend") == "c10d"
    assert flag(argv, "--rdzv-endpoint") == "127.0.0.1:29555"
    assert flag(argv, "--rdzv-id") == "dcpqual"
    assert plan.log_dir == OUT / "torchrun" / "node-01"
    assert options.world_size == 16


def test_user_pytest_args_replace_the_default_suites_and_keep_their_order():
    options = RunOptions(
        nproc_per_node=2, pytest_args=("tests/rank_suites/rank_pass.py", "-k", "x")
    )
    plan = build_plan(options, OUT)
    assert plan.argv[-3:] == ("tests/rank_suites/rank_pass.py", "-k", "x")
    assert str(REPO_ROOT / "suites") not in plan.argv


def test_timeouts_defaults_and_per_test_flag():
    assert RunOptions(nproc_per_node=2).resolved_test_timeout == 300
    assert RunOptions(nproc_per_node=2, timeout_s=100).resolved_test_timeout == 50
    plan = build_plan(RunOptions(nproc_per_node=2, test_timeout_s=7.5), OUT)
    rank_plan = RankPlan.from_environ(plan.env)
    assert rank_plan is not None
    assert (rank_plan.test_timeout_s, rank_plan.collect_timeout_s) == (7.5, 7.5)


def test_relative_out_dir_is_refused_by_the_planner():
    with pytest.raises(ValueError, match="absolute"):
        build_plan(RunOptions(nproc_per_node=2), Path("relative"))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nproc_per_node": 0}, "--nproc-per-node must be an integer >= 1, got 0"),
        ({"nproc_per_node": 2, "nnodes": -1}, "--nnodes must be an integer >= 1, got -1"),
        ({"nproc_per_node": 2, "backend": "mpi"}, "unknown --backend 'mpi'"),
        ({"nproc_per_node": 2, "nnodes": 2, "out_dir": OUT}, "needs --rdzv-endpoint"),
        (
            {"nproc_per_node": 2, "nnodes": 2, "rdzv_endpoint": "h:1"},
            "needs an explicit --out",
        ),
        (
            {"nproc_per_node": 2, "nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"},
            "--node-rank must be in 0..1",
        ),
        ({"nproc_per_node": 2, "rdzv_endpoint": "nohostport"}, "HOST:PORT"),
        ({"nproc_per_node": 2, "rdzv_endpoint": "h:70000"}, "HOST:PORT"),
        ({"nproc_per_node": 2, "timeout_s": 0}, "--timeout must be a number of seconds > 0"),
        ({"nproc_per_node": 2, "test_timeout_s": -1}, "--test-timeout must be"),
        ({"nproc_per_node": 2, "timeout_s": 10, "test_timeout_s": 10}, "must be below --timeout"),
        ({"nproc_per_node": 2, "tp": 0}, "--tp must be an integer >= 1, got 0"),
        ({"nproc_per_node": 2, "dcp": 0}, "--dcp must be an integer >= 1, got 0"),
    ],
)
def test_bad_options_are_refused_with_the_offending_value(kwargs, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunOptions(**kwargs)


def test_geometry_is_checked_against_the_world_size():
    with pytest.raises(UsageError, match="world size 3 does not fit --tp 16: the default DCP"):
        RunOptions(nproc_per_node=3)  # names the default it could not use and the way out
    with pytest.raises(GeometryError, match="dcp=3 does not divide tp=16"):
        RunOptions(nproc_per_node=3, dcp=3)
    with pytest.raises(UsageError, match="world size 4 cannot be split into DCP groups of 8"):
        RunOptions(nproc_per_node=4, tp=16, dcp=8)
    assert RunOptions(nproc_per_node=3, tp=3).resolved_dcp == 3
    assert (
        RunOptions(nproc_per_node=8, nnodes=4, rdzv_endpoint="h:1", out_dir=OUT).resolved_dcp == 16
    )
