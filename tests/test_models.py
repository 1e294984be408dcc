"""Stand-in model trees: shapes of the families, duplicates, and no real allocation."""

from __future__ import annotations

import pytest
import torch

from harness.errors import GeometryError, UsageError
from harness.models.builders import build
from harness.models.layers import (
    DeepseekV4Attention,
    KimiDeltaAttention,
    MLAAttention,
    MultiHeadLatentAttention,
)


def test_kimi_k3_has_mla_on_every_fourth_layer_and_kda_elsewhere():
    built = build("kimi-k3", tp=16, dcp=16, num_layers=8)
    kinds = [type(layer.self_attn) for layer in built.model.layers]
    assert kinds == [KimiDeltaAttention] * 3 + [MultiHeadLatentAttention] + [
        KimiDeltaAttention
    ] * 3 + [MultiHeadLatentAttention]


def test_kimi_k3_attention_carries_the_attributes_warmup_reads():
    attn = build("kimi-k3", tp=16, dcp=16, num_layers=4).model.layers[3].self_attn
    assert (attn.num_heads, attn.num_local_heads) == (96, 6)
    assert (attn.kv_lora_rank, attn.qk_rope_head_dim, attn.head_size) == (512, 64, 576)
    assert attn.dcp_world_size == attn.impl.dcp_world_size == 16
    assert attn.get_attn_backend() is attn.attn_backend
    assert attn.attn_backend.get_name() == "B12X_MLA"


def test_mtp_draft_is_its_own_tree_reachable_only_through_the_forward_context():
    built = build("kimi-k3", tp=16, dcp=16, num_layers=8)
    draft_attn = built.static_forward_context["model.layers.8.self_attn"]
    assert isinstance(draft_attn, MultiHeadLatentAttention)
    assert built.draft is not None
    assert built.draft.model.layers["8"].mtp_block.self_attn is draft_attn
    target = {id(m) for m in built.model.modules()}
    assert id(draft_attn) not in target  # a walk of the target model never meets it
    assert draft_attn is not built.model.layers[7].self_attn
    assert len(built.attention_layers) == 9  # 8 target layers (KDA included) + the draft's


def test_no_draft_when_asked_for_none():
    built = build("kimi-k3", tp=16, dcp=16, num_layers=8, mtp=False)
    assert built.draft is None and len(built.static_forward_context) == 8


def test_kv_cache_dtype_decides_the_kimi_query_dtype():
    def manager(kv: str):
        built = build("kimi-k3", tp=16, dcp=16, num_layers=4, kv_cache_dtype=kv)
        return built.model.layers[3].self_attn.dcp_manager

    assert manager("auto").query_dtype is torch.bfloat16
    assert manager("fp8").query_dtype is torch.float8_e4m3fn
    assert manager("fp8_e4m3").query_dtype is torch.float8_e4m3fn
    assert manager("fp8_ds_mla").query_dtype is torch.bfloat16
    assert manager("fp8").output_dtype is torch.bfloat16


def test_layers_size_their_managers_from_the_engine_settings():
    built = build("kimi-k3", tp=16, dcp=16, num_layers=4, max_num_batched_tokens=8192)
    manager = built.model.layers[3].self_attn.dcp_manager
    assert (manager.num_heads, manager.query_head_dim, manager.output_head_dim) == (6, 576, 512)
    assert (manager.max_num_tokens, manager.comm_backend, manager.b12x) == (8192, "ag_rs", True)


@pytest.mark.parametrize(
    ("settings", "gated"),
    [
        ({"dcp": 4, "dcp_comm_backend": "a2a"}, True),
        ({"dcp": 4}, False),  # ag_rs, vLLM's default
        ({"dcp": 16, "dcp_comm_backend": "a2a"}, False),  # DCP16 is not a B12X generic size
        ({"dcp": 4, "dcp_comm_backend": "a2a", "use_b12x_dcp_a2a": False}, False),
        ({"dcp": 4, "dcp_comm_backend": "a2a", "backend": "flashmla"}, False),
    ],
)
def test_generic_mla_dcp_b12x_gate(settings, gated):
    mla = build("generic-mla", tp=16, num_layers=1, **settings).model.layers[0].self_attn
    assert mla.dcp_b12x is gated and mla.dcp_manager.b12x is gated


def test_deepseek_v4_b12x_layer_class_and_backend():
    dsv4 = build("deepseek-v4", tp=16, dcp=16, num_layers=1).model.layers[0].self_attn
    assert type(dsv4).__name__ == "DeepseekV4B12xMLAAttention"
    assert dsv4.get_attn_backend().get_name() == "V4_B12X_SPARSE"
    other = build("deepseek-v4", tp=16, dcp=16, num_layers=1, backend="flashmla")
    assert type(other.model.layers[0].self_attn) is DeepseekV4Attention


def test_deepseek_v4_and_generic_mla_geometry():
    dsv4 = build("deepseek-v4", tp=16, dcp=16, num_layers=1).model.layers[0].self_attn
    assert isinstance(dsv4, DeepseekV4Attention)
    assert (dsv4.n_local_heads, dsv4.head_dim) == (8, 512)
    mla = build("generic-mla", tp=16, dcp=4, num_layers=1).model.layers[0].self_attn
    assert isinstance(mla, MLAAttention)
    assert (mla.num_heads, mla.head_size, mla.kv_lora_rank) == (8, 576, 512)
    assert mla.impl.dcp_world_size == 4


def test_mixed_model_holds_every_family():
    built = build("mixed", tp=16, dcp=4)
    classes = {type(m).__mro__[0] for m in built.attention_layers} | {
        type(m).__mro__[1] for m in built.attention_layers
    }
    assert {MultiHeadLatentAttention, DeepseekV4Attention, MLAAttention} <= classes


def test_61_layer_kimi_tree_allocates_nothing_real():
    """How fast it builds is `nox -s bench`'s business, not a test's."""
    built = build("kimi-k3", tp=16, dcp=16)
    assert len(built.model.layers) == 61
    real_bytes = sum(
        t.numel() * t.element_size()
        for t in [*built.model.parameters(), *built.model.buffers()]
        if t.device != torch.device("meta")
    )
    assert real_bytes == 0


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(model="kimi-k3", tp=16, dcp=3), GeometryError, "dcp=3 does not divide tp=16"),
        (
            dict(model="kimi-k3", tp=64, dcp=4),
            GeometryError,
            r"at tp=64 \(2 per rank\) a whole rank would hold only padding",
        ),
        (dict(model="llama", tp=1, dcp=1), UsageError, "unknown model 'llama'"),
        (dict(model="kimi-k3", tp=16, dcp=16, backend="foo"), UsageError, "unknown backend"),
        (dict(model="kimi-k3", tp=16, dcp=16, num_layers=0), UsageError, "num_layers"),
    ],
)
def test_bad_specs_raise_clear_errors(kwargs, error, message):
    model = kwargs.pop("model")
    with pytest.raises(error, match=message):
        build(model, **kwargs)
