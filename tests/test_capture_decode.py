"""The decode step: which layers go through a transport and with what geometry (read from the
layers, not from the warm code), the attention math against the combine oracle, and, on two
spawned gloo ranks, the step itself: lazy creation on a miss, and outputs equal to the
whole-context reference."""

from __future__ import annotations

import pytest
import torch
from _support.gloo_spawn import gloo_group, spawn

from harness.capture.check import default_detectors
from harness.capture.decode import (
    DecodeStep,
    padding_mask,
    partial_attention,
    transport_layers,
    transport_manager,
)
from harness.capture.events import LazySpecializationError
from harness.capture.window import CaptureWindow
from harness.core.signature import TransportSignature
from harness.errors import GeometryError
from harness.models.builders import build
from harness.transport.combine import lse_combine
from harness.transport.registry import TransportRegistry
from harness.warm.recognizers import WarmContext
from harness.warm.warmup import warm


def _transport_managers(model: str, **settings: object) -> list[object]:
    built = build(model, tp=16, **settings)  # type: ignore[arg-type]
    return [transport_manager(m) for m in built.attention_layers]


def _asks(manager) -> tuple[object, ...]:
    return (
        manager.num_heads,
        manager.query_head_dim,
        manager.output_head_dim,
        manager.query_dtype,
        manager.output_dtype,
        manager.max_num_tokens,
        manager.comm_backend,
    )


def test_kimi_mla_layers_hand_over_six_local_heads_576_to_512() -> None:
    managers = _transport_managers("kimi-k3", dcp=16, num_layers=8, max_num_batched_tokens=8)
    assert managers.count(None) == 6  # KDA layers: no transport
    bf16 = torch.bfloat16
    assert {_asks(m) for m in managers if m} == {(6, 576, 512, bf16, bf16, 8, "ag_rs")}


def test_fp8_kv_cache_makes_kimi_ask_for_fp8_queries() -> None:
    managers = _transport_managers("kimi-k3", dcp=16, num_layers=4, kv_cache_dtype="fp8")
    assert {(m.query_dtype, m.output_dtype) for m in managers if m} == {
        (torch.float8_e4m3fn, torch.bfloat16)
    }


def test_deepseek_v4_and_generic_mla_managers() -> None:
    [dsv4] = {_asks(m) for m in _transport_managers("deepseek-v4", dcp=4, num_layers=2)}
    bf16 = torch.bfloat16
    assert dsv4 == (8, 512, 512, bf16, bf16, 64, "ag_rs")
    settings = {"dcp": 4, "num_layers": 2, "dcp_comm_backend": "a2a"}
    [mla] = {_asks(m) for m in _transport_managers("generic-mla", **settings)}
    assert mla == (8, 576, 512, bf16, bf16, 64, "a2a")


@pytest.mark.parametrize(
    ("model", "backend", "dcp"),
    [("kimi-k3", "flashmla", 16), ("kimi-k3", "b12x-paged", 16), ("kimi-k3", "b12x", 1),
     ("generic-mla", "b12x", 4), ("deepseek-v4", "flashmla", 4)],
)  # fmt: skip
def test_other_backends_gates_and_dcp1_use_no_transport(model, backend: str, dcp: int) -> None:
    managers = _transport_managers(model, dcp=dcp, num_layers=4, backend=backend)
    assert managers and all(m is None for m in managers)


def test_sharded_partial_attention_combines_to_whole_context_attention() -> None:
    torch.manual_seed(0)
    world, batch, heads, qdim, odim = 4, 2, 8, 24, 16
    queries = torch.randn(batch, heads, qdim, dtype=torch.float64)
    shards = [torch.randn(3 + r, qdim, dtype=torch.float64) for r in range(world)]
    whole, _ = partial_attention(queries.double(), torch.cat(shards), odim)
    partials = [partial_attention(queries, shard, odim) for shard in shards]
    outputs = torch.stack([p[0] for p in partials])
    lses = torch.stack([p[1] for p in partials])
    h = heads // world
    for rank in range(world):
        combined = lse_combine(outputs, lses, rank)
        torch.testing.assert_close(combined, whole[:, rank * h : (rank + 1) * h].float())


# -- two spawned ranks ------------------------------------------------------------------------


def _step_on_two_ranks(rank: int, world: int, store: str) -> None:
    with gloo_group(rank, world, store):
        built = build("kimi-k3", tp=16, dcp=world, num_layers=8, max_num_batched_tokens=4)
        registry = TransportRegistry()
        step = DecodeStep(built, registry=registry)
        kimi = TransportSignature("bf16", 6 * world, 576, 512, world, max_tokens=4)
        assert step.expected_signatures() == (kimi,)
        assert [layer.name for layer in step.layers] == [
            "model.layers.3.self_attn",
            "model.layers.7.self_attn",
            "model.layers.8.self_attn",  # the MTP draft's own layer, from the forward context
        ]
        outputs = step(step.make_inputs(seed=3))  # nothing warmed: created on first use
        assert registry.created == (kimi,) and step.used_signatures == (kimi,)
        assert [tuple(o.shape) for o in outputs] == [(2, 6, 512)] * 3
        for out, ref in zip(outputs, step.reference(seed=3), strict=True):
            torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
        other = step(step.make_inputs(seed=4))
        assert not torch.equal(other[0], outputs[0])
        assert registry.counters.creations == 1
        registry.close()

        # Under an fp8 KV cache the layers hand fp8 queries to the gather: another transport.
        fp8_built = build("kimi-k3", tp=16, dcp=world, num_layers=4, kv_cache_dtype="fp8")
        fp8_registry = TransportRegistry()
        fp8_step = DecodeStep(fp8_built, registry=fp8_registry)
        fp8 = TransportSignature("bf16", 6 * world, 576, 512, world, query_dtype="fp8_e4m3fn")
        assert fp8_step.expected_signatures() == (fp8,)
        fp8_out = fp8_step(fp8_step.make_inputs(seed=5))
        assert fp8_registry.created == (fp8,) and fp8_step.used_signatures == (fp8,)
        for out, ref in zip(fp8_out, fp8_step.reference(seed=5), strict=True):
            torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
        fp8_registry.close()

        mismatched = build("kimi-k3", tp=16, dcp=2 * world, num_layers=4)
        with pytest.raises(GeometryError, match="built for dcp=4"):
            DecodeStep(mismatched, registry=TransportRegistry())


@pytest.mark.slow
def test_decode_step_on_two_ranks_matches_the_reference() -> None:
    spawn(_step_on_two_ranks)


def _fp8_kv_finding(rank: int, world: int, store: str) -> None:
    with gloo_group(rank, world, store):
        built = build("kimi-k3", tp=16, dcp=world, num_layers=4, kv_cache_dtype="fp8")
        registry = TransportRegistry()
        context = WarmContext(dcp_world_size=world)  # production warms the model dtype only
        report = warm(
            built.model,
            registry=registry,
            context=context,
            static_forward_context=built.static_forward_context,
        )
        step = DecodeStep(built, registry=registry)
        window = CaptureWindow(default_detectors(registry), registry=registry, mode="strict")
        with pytest.raises(LazySpecializationError) as caught:
            window.capture(step, step.make_inputs(seed=6))
        wanted = TransportSignature("bf16", 6 * world, 576, 512, world, query_dtype="fp8_e4m3fn")
        assert caught.value.event.signature == wanted
        assert wanted not in report.signatures and len(report.signatures) == 1
        registry.close()


@pytest.mark.slow
def test_fp8_kv_cache_is_a_finding_for_the_vendored_warm() -> None:
    """The vendored warm code (faithful to the seed change) warms bf16 queries; under an fp8 KV
    cache Kimi-K3 gathers fp8 queries, so the capture window sees that transport miss."""
    spawn(_fp8_kv_finding)


# -- padded heads (TP that does not divide the heads) -----------------------------------------


@pytest.mark.parametrize(
    ("model", "tp", "local", "padded_on_last"),
    [
        ("kimi-k3", 9, 11, 3),
        ("kimi-k3", 10, 10, 4),
        ("kimi-k3", 12, 8, 0),
        ("deepseek-v4", 9, 15, 7),
    ],
)
def test_padded_heads_are_the_tail_of_the_last_tp_rank(model, tp, local, padded_on_last) -> None:
    built = build(model, tp=tp, dcp=tp, num_layers=4)
    for _, module, manager in transport_layers(built):
        assert manager.num_heads == local
        masks = [padding_mask(module, local, tp, r) for r in range(tp)]
        assert all(m is None for m in masks[:-1])
        last = masks[-1]
        if padded_on_last == 0:
            assert last is None
        else:
            assert (
                last is not None
                and last.tolist() == [False] * (local - padded_on_last) + [True] * padded_on_last
            )


def test_kimi_k3_at_tp9_asks_for_99_heads() -> None:
    built = build("kimi-k3", tp=9, dcp=9, num_layers=4)
    [(_, module, manager)] = list(transport_layers(built))[:1]
    assert (module.num_local_heads, module.original_num_attention_heads) == (11, 96)
    assert _asks(manager)[:3] == (11, 576, 512)


def test_a_layer_without_an_original_head_count_has_no_padding() -> None:
    assert padding_mask(torch.nn.Identity(), 11, 9, 8) is None
