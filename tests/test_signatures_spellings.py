"""`dcpqual signatures` speaks vLLM's names: --attention-backend, --tensor-parallel-size,
--decode-context-parallel-size; --backend still works here, deprecated, with a warning."""

from __future__ import annotations

import json

import pytest

from harness.cli import main

KIMI = ["--model", "kimi-k3"]


def signatures(capsys, *argv: str) -> tuple[int, list[dict] | None, str]:
    code = main(["signatures", *KIMI, *argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else None, captured.err


def test_vllm_long_names_give_the_same_signatures(capsys):
    _, short, _ = signatures(capsys, "--tp", "16", "--dcp", "4")
    _, long, err = signatures(
        capsys, "--tensor-parallel-size", "16", "--decode-context-parallel-size", "4"
    )
    assert long == short and short and short[0]["total_heads"] == 24 and err == ""


def test_attention_backend_chooses_the_backend_without_a_warning(capsys):
    code, rows, err = signatures(
        capsys, "--tp", "16", "--dcp", "16", "--attention-backend", "flashmla"
    )
    assert (code, rows, err) == (0, [], "")
    code, rows, err = signatures(capsys, "--tp", "16", "--dcp", "16", "--attention-backend", "b12x")
    assert code == 0 and len(rows or []) == 1 and err == ""


def test_backend_is_a_deprecated_alias_that_warns(capsys):
    code, rows, err = signatures(capsys, "--tp", "16", "--dcp", "16", "--backend", "flashmla")
    assert (code, rows) == (0, [])
    assert err.strip() == (
        "dcpqual signatures: warning: --backend is deprecated here, use --attention-backend"
    )


def test_contradicting_backend_flags_are_one_line(capsys):
    argv = ["--tp", "16", "--dcp", "16", "--backend", "flashmla", "--attention-backend", "b12x"]
    code, _, err = signatures(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--backend flashmla contradicts --attention-backend b12x" in err


def refused(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(["signatures", *KIMI, *argv, "--json"])
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert exit_.value.code == 2 and captured.out == ""
    return line


def test_contradicting_tp_or_dcp_spellings_are_refused_and_repeats_are_fine(capsys):
    line = refused(capsys, "--tp", "16", "--tensor-parallel-size", "8", "--dcp", "4")
    assert "--tp 16 and --tensor-parallel-size 8" in line
    line = refused(capsys, "--tp", "16", "--dcp", "4", "--decode-context-parallel-size", "2")
    assert "--dcp 4 and --decode-context-parallel-size 2" in line
    code, rows, err = signatures(
        capsys, "--tp", "16", "--tensor-parallel-size", "16", "--dcp", "4", "--dcp", "4"
    )
    assert code == 0 and rows and err == ""
