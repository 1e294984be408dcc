"""`dcpqual run`'s options, the rank plan and the run context as projections of one set of
options: each default defined once, each shared field carried over by name.

A field added to the rank plan or the run context under an option's name is carried without a
further edit; one that is not an option must be named as the launcher's own, or these fail.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path

from harness.evidence.run_context import RunContext
from harness.launch.collect import RUN_CONTEXT_RESOLVED, run_context
from harness.launch.options import RUN_OPTIONS, option_default
from harness.launch.plan import RANK_PLAN_OWN_FIELDS, RunOptions, build_plan, rank_plan
from harness.schema.launch import Launch
from harness.schema.plan import PLAN_DEFAULTS, RankPlan, default_dcp

RUN_OPTION_FIELDS = {f.name: f for f in fields(RunOptions)}
# Options the launcher resolves before a rank sees them (the rank plan holds the result).
RESOLVED = {"dcp", "test_timeout_s", "engine_model", "engine_config"}
SHARED = set(RankPlan.model_fields) - RANK_PLAN_OWN_FIELDS
RESULT = Launch(exit_code=0, started_at="s", finished_at="f", elapsed_s=1.0)


def test_every_flag_default_is_the_run_options_default():
    with_default = [opt for opt in RUN_OPTIONS if opt.default is not None]
    assert with_default
    for opt in with_default:
        assert RUN_OPTION_FIELDS[opt.dest].default == option_default(opt.dest), opt.dest


def test_every_rank_plan_field_is_an_option_or_the_launchers_own():
    assert SHARED - set(RUN_OPTION_FIELDS) == set()
    # The one name both have that the launcher fills itself: the plan's out folder is the
    # resolved, absolute one.
    assert RANK_PLAN_OWN_FIELDS & set(RUN_OPTION_FIELDS) == {"out_dir"}


def test_an_option_the_ranks_share_defaults_to_the_rank_plans_default():
    for name in SHARED - RESOLVED:
        assert RUN_OPTION_FIELDS[name].default == getattr(PLAN_DEFAULTS, name), name
    options = RunOptions(nproc_per_node=16)
    assert options.resolved_dcp == PLAN_DEFAULTS.resolved_dcp(16) == default_dcp(16)
    assert options.resolved_test_timeout == PLAN_DEFAULTS.test_timeout_s
    assert options.resolved_test_timeout == PLAN_DEFAULTS.collect_timeout_s


def test_the_rank_plan_carries_every_option_it_shares():
    options = RunOptions(
        nproc_per_node=8,
        backend="nccl",
        warm_impl="before-kimi",
        tp=8,
        dcp=4,
        models="both",
        kv_cache_dtype="fp8",
        dcp_comm_backend="a2a",
        real_model="deepseek-v3",
        draft_kv_cache_dtype="fp8",
        engine_model="kimi-k3",
        engine_args=("max-num-seqs=4",),
        engine_env=("X=1",),
        test_timeout_s=7.5,
        maxfail=3,
    )
    plan = rank_plan(options, Path("/tmp/out"))
    for name in SHARED - {"engine_config"}:  # the config file's contents; none given here
        value = getattr(plan, name)
        assert value == getattr(options, name), name
        assert value != getattr(PLAN_DEFAULTS, name), f"{name}: the test sets no other value"
    assert plan.collect_timeout_s == 7.5 and plan.fast_exit and plan.out_dir == "/tmp/out"


def test_the_rank_plan_resolves_what_the_options_leave_open():
    plan = rank_plan(RunOptions(nproc_per_node=2, tp=2, timeout_s=100.0), Path("/tmp/out"))
    assert (plan.dcp, plan.test_timeout_s, plan.collect_timeout_s) == (2, 50.0, 50.0)
    assert plan.engine_model is None and plan.engine_config == {}


def test_the_run_context_carries_every_option_it_shares(tmp_path: Path):
    options = RunOptions(
        nproc_per_node=8,
        nnodes=2,
        node_rank=1,
        rdzv_endpoint="head:29500",
        out_dir=tmp_path,
        backend="nccl",
        warm_impl="before-kimi",
        tp=8,
        dcp=4,
    )
    plan = build_plan(options, tmp_path)
    ctx = run_context(plan, RESULT)
    context_fields = {f.name: f for f in fields(RunContext)}
    shared = (set(context_fields) & set(RUN_OPTION_FIELDS)) - RUN_CONTEXT_RESOLVED
    assert shared >= {"nproc_per_node", "nnodes", "node_rank", "backend", "tp", "warm_impl"}
    for name in shared:
        value = getattr(ctx, name)
        assert value == getattr(options, name), name
        assert value != context_fields[name].default, f"{name}: the test sets no other value"
    assert (ctx.world_size, ctx.dcp, ctx.pytest_args) == (16, 4, plan.targets)


def test_the_run_contexts_defaults_are_the_options_defaults():
    context_fields = {f.name: f for f in fields(RunContext)}
    shared = (set(context_fields) & set(RUN_OPTION_FIELDS)) - RUN_CONTEXT_RESOLVED
    for name in shared:
        default = context_fields[name].default
        if default is not MISSING:
            assert default == RUN_OPTION_FIELDS[name].default, name
    # The context's default geometry is a default run's on the target's 16 ranks.
    assert context_fields["dcp"].default == RunOptions(nproc_per_node=16).resolved_dcp
