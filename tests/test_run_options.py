"""`dcpqual run`'s options: the spellings users bring, precedence, help, refusals.

Nothing here starts torchrun: `launcher.run` is replaced by a recorder, so each test sees the
exact RunOptions the CLI would launch with.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed

from harness.cli import build_parser, main
from harness.errors import UsageError
from harness.launch import launcher
from harness.launch.context import chosen_options
from harness.launch.options import RUN_OPTIONS, check_backend_available, resolve_nproc
from harness.launch.plan import RunOptions, build_plan
from harness.launch.rerun import absolute_nodeid, plugin_args
from harness.schema.plan import RankPlan

SUITE = "tests/rank_suites/rank_pass.py"


@pytest.fixture
def launched(monkeypatch) -> list[RunOptions]:
    seen: list[RunOptions] = []

    def record(options: RunOptions, **kwargs: object) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(launcher, "run", record)
    for opt in RUN_OPTIONS:
        if opt.env:
            monkeypatch.delenv(opt.env, raising=False)
    return seen


def options_of(launched: list[RunOptions], *argv: str) -> RunOptions:
    assert main(["run", *argv, "--", SUITE]) == 0
    return launched.pop()


def one_line_error(capsys, *argv: str) -> str:
    code = main(["run", *argv, "--", SUITE])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


def test_torchrun_and_vllm_spellings_mean_the_same_options(launched):
    ours = options_of(launched, "--nproc-per-node", "2", "--tp", "4", "--dcp", "2")
    theirs = options_of(
        launched,
        "--nproc_per_node",
        "2",
        "--tensor-parallel-size",
        "4",
        "--decode-context-parallel-size",
        "2",
    )
    assert theirs == ours
    assert (ours.nproc_per_node, ours.tp, ours.dcp) == (2, 4, 2)


@pytest.mark.parametrize(
    "first, second",
    [
        (("--tp", "2"), ("--tensor-parallel-size", "4")),
        (("--dcp", "2"), ("--decode-context-parallel-size", "4")),
        (("--nproc-per-node", "2"), ("--nproc_per_node", "4")),
        (("--node-rank", "0"), ("--node_rank", "1")),
        (("--rdzv-endpoint", "a:1"), ("--rdzv_endpoint", "b:2")),
        (("--tp", "2"), ("--tp", "4")),
        (("--backend", "gloo"), ("--backend", "nccl")),
    ],
)
def test_contradicting_spellings_of_one_option_are_refused(capsys, launched, first, second):
    argv = ("--nproc-per-node", "2", *first, *second)
    if first[0].startswith("--nproc"):
        argv = (*first, *second)
    with pytest.raises(SystemExit) as refused:  # argparse refuses it, before any option is used
        main(["run", *argv, "--", SUITE])
    [line] = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2
    assert "given twice with different values" in line
    assert f"{first[0]} {first[1]}" in line and f"{second[0]} {second[1]}" in line
    assert launched == []


def test_the_same_value_under_two_spellings_is_one_value(launched):
    twice = options_of(
        launched,
        "--nproc-per-node",
        "2",
        "--nproc_per_node",
        "2",
        "--tp",
        "4",
        "--tensor-parallel-size",
        "04",
        "--dcp=2",
        "--decode-context-parallel-size",
        "2",
    )
    assert (twice.nproc_per_node, twice.tp, twice.dcp) == (2, 4, 2)


def machine(monkeypatch, *, cuda: bool, nccl: bool, gpus: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: nccl)


@pytest.mark.parametrize(
    "cuda, nccl, gpus, ranks, refused",
    [
        (True, True, 8, 8, None),  # one GPU per local rank: runs
        (True, True, 8, 2, None),
        (True, True, 1, 2, "2 ranks on this node need 2 GPUs, 1 visible"),
        (True, False, 8, 8, "built without NCCL"),
        (False, True, 0, 1, "torch.cuda.is_available() == False"),
    ],
)
def test_nccl_needs_cuda_nccl_and_a_gpu_per_local_rank(
    monkeypatch, cuda, nccl, gpus, ranks, refused
):
    machine(monkeypatch, cuda=cuda, nccl=nccl, gpus=gpus)
    check_backend_available("gloo", ranks)  # gloo asks nothing of the machine
    if refused is None:
        check_backend_available("nccl", ranks)
        return
    with pytest.raises(UsageError, match="--backend nccl needs CUDA GPUs") as info:
        check_backend_available("nccl", ranks, remedy="try elsewhere")
    assert refused in str(info.value) and str(info.value).endswith("; try elsewhere")


def test_run_refuses_nccl_with_fewer_gpus_than_ranks_per_node(monkeypatch, launched, capsys):
    machine(monkeypatch, cuda=True, nccl=True, gpus=1)
    assert main(["run", "--nproc-per-node", "2", "--backend", "nccl"]) == 2
    assert "2 ranks on this node need 2 GPUs, 1 visible" in capsys.readouterr().err
    assert launched == []


def test_nproc_words_resolve_like_torchrun_and_are_recorded(launched):
    cores = len(os.sched_getaffinity(0))
    assert resolve_nproc("cpu") == cores
    assert resolve_nproc("auto", cuda_count=lambda: 0) == cores
    assert resolve_nproc("auto", cuda_count=lambda: 8) == 8
    assert resolve_nproc("gpu", cuda_count=lambda: 16) == 16
    with pytest.raises(UsageError, match="needs CUDA GPUs"):
        resolve_nproc("gpu", cuda_count=lambda: 0)
    options = options_of(launched, "--nproc-per-node", "cpu", "--tp", "16", "--dcp", "1")
    assert options.nproc_per_node == cores
    recorded = chosen_options(options).nproc_per_node
    assert (recorded.requested, recorded.resolved) == ("cpu", cores)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_nproc_gpu_without_gpus_is_one_line(capsys, launched):
    assert "--nproc-per-node gpu needs CUDA GPUs" in one_line_error(
        capsys, "--nproc-per-node", "gpu"
    )


def test_flag_beats_environment_beats_default(launched, monkeypatch):
    base = ("--nproc-per-node", "2", "--tp", "2")
    assert options_of(launched, *base).timeout_s == 3600.0
    monkeypatch.setenv("DCPQUAL_RUN_TIMEOUT", "120")
    monkeypatch.setenv("DCPQUAL_RUN_MAXFAIL", "3")
    from_env = options_of(launched, *base)
    assert (from_env.timeout_s, from_env.maxfail) == (120.0, 3)
    from_flag = options_of(launched, *base, "--timeout", "90", "--maxfail", "2")
    assert (from_flag.timeout_s, from_flag.maxfail) == (90.0, 2)


def test_a_bad_environment_value_names_the_variable(capsys, launched, monkeypatch):
    monkeypatch.setenv("DCPQUAL_RUN_TIMEOUT", "soon")
    line = one_line_error(capsys, "--nproc-per-node", "2", "--tp", "2")
    assert "$DCPQUAL_RUN_TIMEOUT must be a number of seconds, got 'soon'" in line


def run_help() -> str:
    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    return " ".join(run.format_help().split())


def test_help_lists_every_spelling_and_states_precedence_and_real_defaults():
    text = run_help()
    for opt in RUN_OPTIONS:
        for flag in opt.flags:
            assert flag in text
        assert opt.help_text().split(" (flag")[0].split()[0] in text
    assert "flag > $DCPQUAL_RUN_TIMEOUT > default: 3600" in text
    assert "default: min(300, --timeout / 2)" in text
    # The help's formula is the one the launcher applies.
    assert RunOptions(nproc_per_node=2, tp=2, timeout_s=100.0).resolved_test_timeout == 50.0
    assert RunOptions(nproc_per_node=2, tp=2, timeout_s=7200.0).resolved_test_timeout == 300.0


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--maxfail", "-1"], "--maxfail must be an integer >= 0, got -1"),
        (["--maxfail", "two"], "--maxfail must be an integer, got 'two'"),
        (
            ["--stream-ranks", "0,5"],
            "--stream-ranks names local rank(s) 5, but this node runs local ranks 0..1",
        ),
        (["--stream-ranks", "x"], "--stream-ranks must be comma-separated local ranks"),
        (["--local-ranks-filter", "x"], "--stream-ranks must be comma-separated local ranks"),
        (["--nproc_per_node", "many"], "--nproc-per-node must be an integer, got 'many'"),
    ],
)
def test_bad_new_options_are_one_line(capsys, launched, argv, needle):
    base = (
        ["--tp", "2"] if argv[0].startswith("--nproc") else ["--nproc-per-node", "2", "--tp", "2"]
    )
    line = one_line_error(capsys, *base, *argv)
    assert line.startswith("dcpqual run: error: ") and needle in line


def test_missing_nproc_is_one_line(capsys, launched):
    assert "--nproc-per-node N|auto|cpu|gpu is required" in one_line_error(capsys, "--tp", "2")


def test_tee_and_maxfail_reach_torchrun_and_the_ranks(tmp_path: Path):
    options = RunOptions(nproc_per_node=4, tp=4, tee=(0, 3), maxfail=2, pytest_args=(SUITE,))
    plan = build_plan(options, tmp_path)
    argv = plan.argv
    assert "--tee=3" in argv and "--local-ranks-filter=0,3" in argv
    assert "--redirects=3" in argv  # every rank still has its own log files
    assert getattr(RankPlan.from_environ(plan.env), "maxfail", None) == 2
    default = build_plan(RunOptions(nproc_per_node=4, tp=4, pytest_args=(SUITE,)), tmp_path)
    assert not any(a.startswith(("--tee", "--local-ranks-filter")) for a in default.argv)
    assert getattr(RankPlan.from_environ(default.env), "maxfail", None) == 1


def test_rerun_refuses_a_bundle_that_does_not_verify(capsys, launched, tmp_path: Path):
    bundle = tmp_path / "not-a-bundle"
    bundle.mkdir()
    (bundle / "receipt.json").write_text("{}")
    code = main(["run", "--rerun-failed", str(bundle)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert f"--rerun-failed {bundle}: the bundle does not verify" in err[0]
    assert launched == []


def test_rerun_refuses_extra_pytest_arguments(capsys, launched, tmp_path: Path):
    line = one_line_error(capsys, "--rerun-failed", str(tmp_path))
    assert "--rerun-failed chooses the tests itself" in line


def test_plugins_a_rerun_may_be_given_are_read_as_pairs():
    run = ["suites/x", "-p", "xdist", "-ptimeout", "-p", "no:warnings", "-k", "p", "--pdb"]
    assert plugin_args(run) == ("-p", "xdist", "-p", "timeout", "-p", "no:warnings")
    assert plugin_args(["suites", "-k", "-p"]) == ()
    assert plugin_args(["-p"]) == ()


def test_node_ids_are_made_absolute_against_the_rank_rootdir():
    root = Path("/repo")
    assert absolute_nodeid("suites/a/test_b.py::t[x-1]", root) == "/repo/suites/a/test_b.py::t[x-1]"
    assert absolute_nodeid("/else/test_b.py::t", root) == "/else/test_b.py::t"
    assert absolute_nodeid("suites/a/test_b.py::t", None) == "suites/a/test_b.py::t"


def test_torchrun_local_ranks_filter_chooses_the_streamed_ranks(launched, capsys):
    options = options_of(
        launched, "--nproc-per-node", "2", "--tp", "2", "--local-ranks-filter", "1"
    )
    assert options.tee == (1,)
    assert capsys.readouterr().err == ""


def test_tee_still_works_as_a_deprecated_alias_with_a_warning(launched, capsys):
    options = options_of(launched, "--nproc-per-node", "2", "--tp", "2", "--tee", "0,1")
    assert options.tee == (0, 1)
    [warning] = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith("dcpqual run: warning: --tee is deprecated; use --stream-ranks")


def test_the_stream_ranks_name_is_not_torchruns_tee(launched, capsys):
    options = options_of(launched, "--nproc-per-node", "2", "--tp", "2", "--stream-ranks", "0")
    assert options.tee == (0,) and capsys.readouterr().err == ""
