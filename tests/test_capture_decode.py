"""The decode step: which layers go through a transport and with what geometry (read from the
layers, not from the warm code), the attention math against the combine oracle, and, on two
spawned gloo ranks, the step itself: lazy creation on a miss, and outputs equal to the
whole-context reference."""

from __future__ import annotations

import pytest
import torch
from gloo_spawn import gloo_group, spawn

from harness.capture.decode import DecodeStep, LayerGeometry, partial_attention, runtime_geometry
from harness.errors import GeometryError
from harness.models import build
from harness.transport.combine import lse_combine
from harness.transport.registry import TransportRegistry
from harness.warm.recognizers import WarmContext
from harness.warm.signature import TransportSignature


def _attention_layers(model: str, **kwargs: object) -> list[object]:
    return build(model, tp=16, **kwargs).attention_layers  # type: ignore[arg-type]


def test_kimi_mla_layers_hand_over_six_local_heads_576_to_512() -> None:
    layers = _attention_layers("kimi-k3", dcp=16, num_layers=8)
    geometries = [runtime_geometry(m) for m in layers]
    assert geometries.count(None) == 6  # KDA layers: no transport
    assert {g for g in geometries if g} == {LayerGeometry(6, 576, 512, 16)}


def test_deepseek_v4_and_generic_mla_geometries() -> None:
    [dsv4] = {runtime_geometry(m) for m in _attention_layers("deepseek-v4", dcp=4, num_layers=2)}
    assert dsv4 == LayerGeometry(8, 512, 512, None)
    [mla] = {runtime_geometry(m) for m in _attention_layers("generic-mla", dcp=4, num_layers=2)}
    assert mla == LayerGeometry(8, 576, 512, 4)


@pytest.mark.parametrize(
    ("backend", "dcp"), [("flashmla", 16), ("b12x-paged", 16), ("b12x", 1)]
)  # fmt: skip
def test_other_backends_and_dcp1_use_no_transport(backend: str, dcp: int) -> None:
    layers = _attention_layers("kimi-k3", dcp=dcp, num_layers=4, backend=backend)
    assert all(runtime_geometry(m) is None for m in layers)


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
        built = build("kimi-k3", tp=16, dcp=world, num_layers=8)
        context = WarmContext(max_tokens=4, dcp_world_size=world)
        registry = TransportRegistry()
        step = DecodeStep(built, registry=registry, context=context)
        kimi = TransportSignature("bf16", 6 * world, 576, 512, world, max_tokens=4)
        assert step.expected_signatures() == (kimi,)
        assert [layer.name for layer in step.layers] == [
            "model.layers.3.self_attn",
            "model.layers.7.self_attn",
            "model.mtp.shared_attn",  # the MTP head runs the shared module once more
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

        mismatched = build("kimi-k3", tp=16, dcp=2 * world, num_layers=4)
        with pytest.raises(GeometryError, match="built for dcp=4"):
            DecodeStep(mismatched, registry=TransportRegistry(), context=context)


@pytest.mark.slow
def test_decode_step_on_two_ranks_matches_the_reference() -> None:
    spawn(_step_on_two_ranks)
