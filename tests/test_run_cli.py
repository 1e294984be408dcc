"""`dcpqual run` refuses unusable input with one line and exit 2, before touching anything."""

from __future__ import annotations

import pytest
import torch

from harness.cli import main
from harness.launch import launcher


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    """Nothing in this file may start torchrun: a refused run never gets that far."""

    def refuse(*args, **kwargs):
        raise AssertionError("launcher.run was reached")

    monkeypatch.setattr(launcher, "run", refuse)


def one_line_error(capsys, argv: list[str]) -> str:
    code = main(["run", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dcpqual run: error: ")
    return lines[0]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--nproc-per-node", "0"], "--nproc-per-node must be an integer >= 1, got 0"),
        (["--nproc-per-node", "two"], "--nproc-per-node must be an integer, got 'two'"),
        (["--nproc-per-node", "2", "--nnodes", "0"], "--nnodes must be an integer >= 1"),
        (["--nproc-per-node", "2", "--backend", "mpi"], "unknown --backend 'mpi'"),
        (["--nproc-per-node", "2", "--timeout", "soon"], "--timeout must be a number"),
        (["--nproc-per-node", "2", "--test-timeout", "0"], "--test-timeout must be"),
        (["--nproc-per-node", "2", "--nnodes", "2", "--out", "x"], "needs --rdzv-endpoint"),
        (["--nproc-per-node", "2", "--tp", "16", "--dcp", "5"], "dcp=5 does not divide tp=16"),
        (["--nproc-per-node", "2", "tests/x.py"], "pytest arguments go after --"),
        (["--nproc-per-node", "2", "--warm-impl", "nonsense"], "unknown --warm-impl 'nonsense'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    assert needle in one_line_error(capsys, argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_nccl_without_cuda_is_refused(capsys):
    assert "needs CUDA" in one_line_error(capsys, ["--nproc-per-node", "2", "--backend", "nccl"])


def test_existing_non_empty_out_is_refused_and_left_untouched(capsys, tmp_path, monkeypatch):
    monkeypatch.undo()  # the real pipeline, up to the out folder check

    def must_not_launch(*args, **kwargs):
        raise AssertionError("launched despite a non-empty --out")

    monkeypatch.setattr(launcher, "launch", must_not_launch)
    out = tmp_path / "old"
    out.mkdir()
    (out / "receipt.json").write_text('{"verdict": "pass"}')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    message = one_line_error(capsys, ["--nproc-per-node", "2", "--out", str(out)])
    assert str(out) in message and "not empty" in message
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_pytest_args_after_double_dash_are_passed_through(monkeypatch):
    seen = {}

    def capture(options):
        seen["options"] = options
        return 0

    monkeypatch.setattr(launcher, "run", capture)
    code = main(["run", "--nproc-per-node", "2", "--", "tests/rank_suites/rank_pass.py", "-k", "x"])
    assert code == 0
    assert seen["options"].pytest_args == ("tests/rank_suites/rank_pass.py", "-k", "x")
