"""`dcpqual run`'s options, the rank plan and the run context as projections of one set of
options: each flag defined once, on the RunOptions field it sets; each shared field carried
over by name.

The parser is built from the fields alone: a flag added anywhere else, or a field added without
saying where its value comes from, fails here. A field added to the rank plan or the run context
under an option's name is carried without a further edit; one that is not an option must be
named as the launcher's own, or these fail.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from pathlib import Path

from harness.cli import build_parser
from harness.evidence.run_context import RunContext
from harness.launch.cli import options_from_args
from harness.launch.context import RUN_CONTEXT_RESOLVED, run_context
from harness.launch.options import FLAG_KEY, RUN_OPTIONS
from harness.launch.plan import RANK_PLAN_OWN_FIELDS, RunOptions, build_plan, rank_plan
from harness.schema.launch import Launch
from harness.schema.plan import PLAN_DEFAULTS, RankPlan, default_dcp

RUN_OPTION_FIELDS = {f.name: f for f in fields(RunOptions)}
# The fields no flag sets: the command line's pytest arguments (after --), what pytest's parser
# says of them, --nproc-per-node as typed, and whether a rerun's seed was drawn.
NOT_FLAGS = {"pytest_args", "pytest_names_targets", "nproc_requested", "hash_seed_drawn"}
# Options the launcher resolves before a rank sees them (the rank plan holds the result).
RESOLVED = {"dcp", "test_timeout_s", "engine_model", "engine_config"}
SHARED = set(RankPlan.model_fields) - RANK_PLAN_OWN_FIELDS
RESULT = Launch(exit_code=0, started_at="s", finished_at="f", elapsed_s=1.0)
SUITE = "tests/rank_suites/rank_pass.py"


def run_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices["run"]


def test_the_parsers_arguments_are_the_run_options_flags_and_nothing_else():
    actions = [a for a in run_parser()._actions if not isinstance(a, argparse._HelpAction)]
    flagged = [a for a in actions if a.option_strings]
    # In the fields' order (the help's), each spelled as its field says, setting that field.
    assert [(a.dest, tuple(a.option_strings)) for a in flagged] == [
        (f.name, f.metadata[FLAG_KEY].flags) for f in fields(RunOptions) if FLAG_KEY in f.metadata
    ]
    assert [a.dest for a in actions if not a.option_strings] == ["pytest_args"]
    assert {o.dest for o in RUN_OPTIONS} == set(RUN_OPTION_FIELDS) - NOT_FLAGS


def test_a_flags_default_is_the_fields_default_and_the_help_says_it():
    with_default = [opt for opt in RUN_OPTIONS if opt.default is not None]
    assert with_default
    for opt in with_default:
        assert RUN_OPTION_FIELDS[opt.dest].default == opt.parse(opt.flag, opt.default), opt.dest
        assert f"default: {opt.default})" in opt.help_text(), opt.dest
    # A flag without a default text leaves its field's own "unset" value.
    assert RUN_OPTION_FIELDS["draft_kv_cache_dtype"].default == ""
    assert RUN_OPTION_FIELDS["nproc_per_node"].default is MISSING  # required


def test_a_repeatable_flag_reaches_its_field_with_every_value_in_order():
    args = run_parser().parse_args(
        [
            "--nproc-per-node=2",
            "--tp=2",
            "--engine-arg=seed=1",
            "--engine-arg=max-num-seqs=4",
            "--engine-env=X=1",
            "--",
            SUITE,
        ]
    )
    options = options_from_args(args, environ={})
    assert options.engine_args == ("seed=1", "max-num-seqs=4")
    assert options.engine_env == ("X=1",)
    assert options_from_args(run_parser().parse_args(["--nproc-per-node=2", "--tp=2"]), {}) == (
        RunOptions(nproc_per_node=2, tp=2, nproc_requested="2")
    )


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
        hash_seed=1234,
        hash_seed_drawn=True,
    )
    plan = rank_plan(options, Path("/tmp/out"))
    for name in SHARED - {"engine_config"}:  # the config file's contents; none given here
        value = getattr(plan, name)
        assert value == getattr(options, name), name
        assert value != getattr(PLAN_DEFAULTS, name), f"{name}: the test sets no other value"
    assert plan.collect_timeout_s == 7.5 and plan.out_dir == "/tmp/out"
    assert plan.fast_exit  # records and junit are final: no teardown


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
