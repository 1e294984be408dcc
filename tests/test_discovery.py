"""Vendored discovery: the seed change's behaviour, and what it must leave unchanged."""

from __future__ import annotations

import pytest
from _support.layers import generic_layer, kimi_layer
from torch import nn

from harness.core.signature import TransportSignature
from harness.models.backends import B12XMLABackend, FlashMLABackend
from harness.models.builders import build
from harness.models.layers import MultiHeadLatentAttention
from harness.warm.discovery import discover
from harness.warm.recognizers import (
    RECOGNIZER_SETS,
    WarmContext,
    backend_name,
    recognizer_set,
)


def signatures(model, tp, dcp, *, backend="b12x", recognizers="vendored", dtype="bf16", **kw):
    built = build(model, tp=tp, dcp=dcp, backend=backend, dtype=dtype, **kw)
    comm = kw.get("dcp_comm_backend", "ag_rs")
    return discover(
        built.model,
        context=WarmContext(dtype=dtype, max_tokens=64, dcp_world_size=dcp, comm_backend=comm),
        recognizers=recognizer_set(recognizers),
        static_forward_context=built.static_forward_context,
    )


def shape(sig: TransportSignature) -> tuple[int, int, int]:
    return (sig.total_heads, sig.query_head_dim, sig.output_head_dim)


def test_kimi_k3_tp16_dcp16_yields_exactly_one_96x576x512_signature():
    found = signatures("kimi-k3", 16, 16)
    assert [shape(s) for s in found.signatures] == [(96, 576, 512)]
    (sig,) = found.signatures
    assert (sig.local_heads, sig.dcp_world_size, sig.dtype) == (6, 16, "bf16")
    assert found.per_kind == {"kimi-k3": 16}  # 61 layers, MLA on every fourth; the MTP draft


@pytest.mark.parametrize(
    "tp, dcp, expected",
    [
        (16, 16, (96, 576, 512)),
        (8, 8, (96, 576, 512)),
        (16, 4, (24, 576, 512)),
        (16, 2, (12, 576, 512)),
    ],
)
def test_kimi_k3_geometries(tp, dcp, expected):
    assert [shape(s) for s in signatures("kimi-k3", tp, dcp).signatures] == [expected]


def test_tp8_dcp8_has_twelve_local_heads():
    (sig,) = signatures("kimi-k3", 8, 8).signatures
    assert sig.local_heads == 12


@pytest.mark.parametrize("model", ["kimi-k3", "deepseek-v4", "generic-mla", "mixed"])
def test_dcp1_gives_no_signature(model):
    assert signatures(model, 16, 1).signatures == ()


@pytest.mark.parametrize("backend", ["flashmla", "triton-mla", "flashinfer-mla", "b12x-paged"])
@pytest.mark.parametrize("model", ["kimi-k3", "deepseek-v4", "generic-mla"])
def test_non_b12x_dense_mla_backends_give_no_signature(model, backend):
    found = signatures(model, 16, 4, backend=backend, dcp_comm_backend="a2a")
    assert found.signatures == ()


@pytest.mark.parametrize("model", ["deepseek-v4", "generic-mla"])
@pytest.mark.parametrize("tp, dcp", [(16, 8), (16, 4), (8, 2)])
def test_other_families_are_unchanged_by_the_kimi_recognizer(model, tp, dcp):
    after = signatures(model, tp, dcp, recognizers="vendored", dcp_comm_backend="a2a")
    before = signatures(model, tp, dcp, recognizers="before-kimi", dcp_comm_backend="a2a")
    assert after.signatures == before.signatures != ()


def test_deepseek_v4_and_generic_mla_signatures():
    assert [shape(s) for s in signatures("deepseek-v4", 16, 16).signatures] == [(128, 512, 512)]
    generic = signatures("generic-mla", 8, 8, dcp_comm_backend="a2a").signatures
    assert [(shape(s), s.comm_backend) for s in generic] == [((128, 576, 512), "a2a")]


@pytest.mark.parametrize(
    "settings",
    [{"dcp_comm_backend": "ag_rs"}, {"dcp_comm_backend": "a2a", "use_b12x_dcp_a2a": False}],
)
def test_generic_mla_outside_the_dcp_b12x_gate_gives_no_signature(settings):
    assert signatures("generic-mla", 8, 8, **settings).signatures == ()
    assert signatures("generic-mla", 16, 16, dcp_comm_backend="a2a").signatures == ()


def test_before_kimi_set_finds_no_kimi_signature():
    assert signatures("kimi-k3", 16, 16, recognizers="before-kimi").signatures == ()
    mixed = signatures("mixed", 8, 8, recognizers="before-kimi", dcp_comm_backend="a2a")
    assert (96, 576, 512) not in [shape(s) for s in mixed.signatures]
    assert "kimi-k3" not in {r.kind for r in RECOGNIZER_SETS["before-kimi"]}


def test_mixed_model_signatures_are_sorted_and_distinct():
    found = signatures("mixed", 8, 8, dcp_comm_backend="a2a")
    assert list(found.signatures) == sorted(set(found.signatures))
    assert [shape(s) for s in found.signatures] == [
        (96, 576, 512),
        (128, 512, 512),
        (128, 576, 512),
    ]


def test_duplicates_never_add_a_layer_or_signature():
    built = build("kimi-k3", tp=16, dcp=16, num_layers=8)
    ctx = WarmContext(dcp_world_size=16)
    plain = discover(built.model, context=ctx, recognizers=recognizer_set("vendored"))
    with_context = discover(
        built.model,
        context=ctx,
        recognizers=recognizer_set("vendored"),
        static_forward_context=built.static_forward_context,
    )
    # Two MLA layers in the target, each seen again in the context; the draft's only there.
    assert len(plain.layers) == 2 and len(with_context.layers) == 3
    assert plain.signatures == with_context.signatures
    assert with_context.duplicates_skipped == len(built.static_forward_context) - 1


def test_kda_layers_are_never_recognized_even_with_b12x_backend():
    built = build("kimi-k3", tp=16, dcp=16, num_layers=3)  # KDA only
    kda = built.model.layers[0].self_attn
    kda.attn_backend = B12XMLABackend  # even a KDA layer on the B12X MLA backend is not MLA
    found = discover(
        built.model, context=WarmContext(dcp_world_size=16), recognizers=recognizer_set("vendored")
    )
    assert found.signatures == ()


def test_subclasses_of_recognized_classes_are_recognized():
    class PatchedKimiAttention(MultiHeadLatentAttention):
        pass

    built = build("kimi-k3", tp=16, dcp=16, num_layers=4)
    built.model.layers[3].self_attn.__class__ = PatchedKimiAttention
    found = discover(
        built.model, context=WarmContext(dcp_world_size=16), recognizers=recognizer_set("vendored")
    )
    assert [shape(s) for s in found.signatures] == [(96, 576, 512)]


def test_layer_without_backend_is_ignored():
    layer = nn.Linear(2, 2, device="meta")
    assert backend_name(layer) is None


def test_dtype_and_max_tokens_flow_into_signatures():
    built = build("kimi-k3", tp=16, dcp=16, num_layers=4, dtype="fp16")
    found = discover(
        built.model,
        context=WarmContext(dtype="fp16", max_tokens=8192, dcp_world_size=16),
        recognizers=recognizer_set("vendored"),
    )
    (sig,) = found.signatures
    assert (sig.dtype, sig.max_tokens) == ("fp16", 8192)


def test_kimi_layer_own_dcp_size_counts_when_the_impl_does_not_know_it():
    # vLLM sets impl.dcp_world_size to 1 when the backend impl left it unset (-1); the layer's
    # own dcp_world_size (from the parallel config) still says DCP16.
    built = build("kimi-k3", tp=16, dcp=16, num_layers=4)
    layer = built.model.layers[3].self_attn
    layer.impl.dcp_world_size = 1
    found = discover(
        built.model, context=WarmContext(dcp_world_size=16), recognizers=recognizer_set("vendored")
    )
    assert [(shape(s), s.dcp_world_size) for s in found.signatures] == [((96, 576, 512), 16)]


def test_a_draft_layer_under_an_mtp_name_is_discovered():
    # A draft layer reachable only through the forward context, under an "mtp" name, with a
    # signature of its own (another TP split): skipping it would leave its transport unwarmed.
    target = build("kimi-k3", tp=16, dcp=16, num_layers=4)
    draft = build("kimi-k3", tp=8, dcp=8, num_layers=4).model.layers[3].self_attn
    context = {"model.mtp.layers.4.mtp_block.self_attn": draft}
    found = discover(
        target.model,
        context=WarmContext(dcp_world_size=16),
        recognizers=recognizer_set("vendored"),
        static_forward_context=context,
    )
    assert [(s.local_heads, s.dcp_world_size) for s in found.signatures] == [(12, 8), (6, 16)]
    assert [layer.name for layer in found.layers][-1] == "model.mtp.layers.4.mtp_block.self_attn"


def test_every_candidate_is_counted_repeats_included():
    """A layer referenced twice in the tree (as an MTP head re-references a decoder's) is a
    candidate each time, and so is every forward-context value: the counts say how much the
    walk saw, the duplicates how much of it was skipped."""
    layer = kimi_layer()
    tree = nn.Sequential(layer, layer)  # root, layer, o_proj, layer again, o_proj again
    found = discover(
        tree,
        context=WarmContext(dcp_world_size=16),
        recognizers=recognizer_set("vendored"),
        static_forward_context={"model.layers.3.self_attn": layer},
    )
    assert (found.candidates_seen, found.duplicates_skipped) == (6, 3)
    assert len(found.layers) == 1


def test_a_recognized_class_that_needs_no_transport_does_not_end_the_walk():
    """A layer of a recognized class on another backend gives no signature; the layers after
    it are still inspected."""
    tree = nn.Sequential(kimi_layer(backend=FlashMLABackend), kimi_layer())
    found = discover(
        tree, context=WarmContext(dcp_world_size=16), recognizers=recognizer_set("vendored")
    )
    assert [layer.name for layer in found.layers] == ["1"]
    assert [shape(s) for s in found.signatures] == [(96, 576, 512)]


def test_kinds_by_signature_names_every_kind_that_needs_each_signature():
    """A generic MLA layer with 6 local heads at DCP16 needs the very transport Kimi-K3 does:
    one signature, needed by both kinds (sorted); a DeepSeek-V4 layer needs its own."""
    dsv4 = build("deepseek-v4", tp=16, dcp=16, num_layers=1).static_forward_context
    generic = generic_layer(num_heads=6, dcp=16)
    generic.dcp_b12x = True  # the gate, opened at a DCP size the fork does not offer
    tree = nn.Sequential(kimi_layer(), generic, *dsv4.values())
    found = discover(
        tree, context=WarmContext(dcp_world_size=16), recognizers=recognizer_set("vendored")
    )
    kimi_sig, dsv4_sig = sorted(found.signatures, key=lambda s: s.query_head_dim, reverse=True)
    assert found.kinds_by_signature == {
        kimi_sig: ("generic-mla", "kimi-k3"),
        dsv4_sig: ("deepseek-v4",),
    }
    assert shape(kimi_sig) == (96, 576, 512) and shape(dsv4_sig) == (128, 512, 512)
