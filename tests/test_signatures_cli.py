"""`dcpqual signatures`: the contract other tools parse, and one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.cli import main


def run_json(capsys, *args: str) -> list[dict]:
    assert main(["signatures", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_kimi_k3_tp16_dcp16_json(capsys):
    (row,) = run_json(capsys, "--model", "kimi-k3", "--tp", "16", "--dcp", "16")
    assert {k: row[k] for k in ("total_heads", "query_head_dim", "output_head_dim")} == {
        "total_heads": 96,
        "query_head_dim": 576,
        "output_head_dim": 512,
    }
    assert (row["dtype"], row["dcp_world_size"], row["max_tokens"]) == ("bf16", 16, 64)


def test_options_flow_into_the_signature(capsys):
    (row,) = run_json(
        capsys, "--model", "kimi-k3", "--tp", "16", "--dcp", "4",
        "--dtype", "fp16", "--max-tokens", "512",
    )  # fmt: skip
    assert (row["total_heads"], row["dtype"], row["max_tokens"]) == (24, "fp16", 512)


def test_non_b12x_backend_prints_an_empty_list(capsys):
    assert (
        run_json(capsys, "--model", "kimi-k3", "--tp", "16", "--dcp", "16", "--backend", "flashmla")
        == []
    )


def test_human_output(capsys):
    assert main(["signatures", "--model", "mixed", "--tp", "16", "--dcp", "16"]) == 0
    out = capsys.readouterr().out
    # Generic MLA uses the B12X transport only with a2a at DCP 2/4/8 (`dcp_b12x`).
    assert "2 signature(s)" in out and "96 heads (6 local x dcp 16) x 576 -> 512" in out
    argv = ["signatures", "--model", "mixed", "--tp", "16", "--dcp", "8"]
    assert main([*argv, "--dcp-comm-backend", "a2a"]) == 0
    out = capsys.readouterr().out
    assert "3 signature(s)" in out and "64 heads (8 local x dcp 8) x 576 -> 512" in out
    assert "ag_rs" not in out and out.count(", a2a,") == 3


def test_json_says_query_dtype_and_comm_backend_and_keeps_dtype(capsys):
    argv = ["signatures", "--model", "kimi-k3", "--tp", "16", "--dcp", "16", "--json"]
    assert main([*argv, "--kv-cache-dtype", "fp8"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    # The vendored warm code warms one dtype (the model's) for query and output.
    assert (row["dtype"], row["query_dtype"], row["comm_backend"]) == ("bf16", "bf16", "ag_rs")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "kimi-k3", "--tp", "16", "--dcp", "5"], "dcp=5 does not divide tp=16"),
        (["--model", "kimi-k3", "--tp", "0", "--dcp", "1"], "tp must be a positive integer"),
        (["--model", "kimi-k3", "--tp", "64", "--dcp", "4"], "not divisible by tp=64"),
        (
            ["--model", "kimi-k3", "--tp", "16", "--dcp", "16", "--max-tokens", "0"],
            "max_num_batched_tokens must be a positive integer, got 0",
        ),
        (["--model", "llama", "--tp", "16", "--dcp", "16"], "invalid choice: 'llama'"),
        (["--model", "kimi-k3", "--tp", "x", "--dcp", "16"], "invalid int value"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, message):
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "signatures", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""
