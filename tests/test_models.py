"""Stand-in model trees: shapes of the families, duplicates, and no real allocation."""

from __future__ import annotations

import pytest
import torch

from harness.errors import GeometryError, UsageError
from harness.models import build
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


def test_mtp_reuses_an_existing_attention_module_and_context_registers_layers_again():
    built = build("kimi-k3", tp=16, dcp=16, num_layers=8)
    last_mla = built.model.layers[7].self_attn
    assert built.model.mtp.shared_attn is last_mla
    assert built.static_forward_context["model.layers.7.self_attn"] is last_mla
    assert built.static_forward_context["model.mtp.shared_attn"] is last_mla
    assert len(built.attention_layers) == 8  # distinct modules, KDA included


def test_deepseek_v4_and_generic_mla_geometry():
    dsv4 = build("deepseek-v4", tp=16, dcp=16, num_layers=1).model.layers[0].self_attn
    assert isinstance(dsv4, DeepseekV4Attention)
    assert (dsv4.n_local_heads, dsv4.head_dim) == (8, 512)
    mla = build("generic-mla", tp=16, dcp=4, num_layers=1).model.layers[0].self_attn
    assert isinstance(mla, MLAAttention)
    assert (mla.num_heads, mla.head_size, mla.kv_lora_rank) == (8, 576, 512)
    assert mla.impl.dcp_world_size == 4


def test_mixed_model_holds_every_family():
    built = build("mixed", tp=16, dcp=16)
    classes = {type(m) for m in built.attention_layers}
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
        (dict(model="kimi-k3", tp=64, dcp=4), GeometryError, "not divisible by tp=64"),
        (dict(model="llama", tp=1, dcp=1), UsageError, "unknown model 'llama'"),
        (dict(model="kimi-k3", tp=16, dcp=16, backend="foo"), UsageError, "unknown backend"),
        (dict(model="kimi-k3", tp=16, dcp=16, num_layers=0), UsageError, "num_layers"),
    ],
)
def test_bad_specs_raise_clear_errors(kwargs, error, message):
    model = kwargs.pop("model")
    with pytest.raises(error, match=message):
        build(model, **kwargs)
