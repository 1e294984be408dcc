"""What a rank built from vLLM's real trees reaches its record as the schema's `RealTreeRecord`:
every key the builder reports is one the record's model accepts (it refuses unknown keys)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from torch import nn

from harness.models.real.builder import RealSpec, RealTree, _vllm_class

SPECS = [
    RealSpec(model="kimi-k3", tp=2, dcp=2),
    RealSpec(model="kimi-k3", tp=2, dcp=2, draft_kv_cache_dtype="fp8", kv_cache_dtype="auto"),
    RealSpec(model="deepseek-v3", tp=2, dcp=2, dcp_comm_backend="a2a"),
]


class Attention(nn.Module):
    """Stands for one of vLLM's attention layers (only its class name is read)."""


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.model}-{s.draft_kv_cache_dtype}")
def test_every_key_the_builder_reports_is_in_the_record_model(spec: RealSpec) -> None:
    draft = nn.Module() if spec.model == "kimi-k3" else None
    tree = RealTree(
        spec=spec,
        target=nn.Module(),
        draft=draft,
        vllm_config=None,
        static_forward_context={"layers.0.attn": Attention()},
        dcp_group=None,
        shims=(),
        build_s=1.5,
        import_s=2.0,
        draft_layers=("draft.layers.0.attn",) if draft is not None else (),
    )
    record = tree.record()
    assert record.configuration().model == spec.model
    assert record.draft_kv_cache_dtype == spec.draft_kv_cache_dtype
    assert record.dcp_comm_backend == spec.dcp_comm_backend
    assert [item.line() for item in record.limitations] == list(tree.limitations())


def test_a_draft_class_path_must_name_a_class() -> None:
    assert _vllm_class("collections:OrderedDict") is OrderedDict
    with pytest.raises(TypeError, match="builtins:len is a builtin_function_or_method"):
        _vllm_class("builtins:len")
