"""Warmup on every rank: the vendored discovery agrees across ranks and creates each transport once.

These run the warm implementation the run qualifies (`--warm-impl`) against the real transport
registry on the run's DCP group, at the run's geometry (TP16/DCP16 on 16 ranks).
"""

from __future__ import annotations

import json

import pytest

from harness.capture.check import int_ranges, same_on_every_rank
from harness.models.builders import build
from harness.models.warm_impls import resolve_warm_impl
from harness.transport.registry import stand_in_registry
from harness.warm.discovery import discover
from harness.warm.recognizers import WarmContext, recognizer_set

MODELS = ("kimi-k3", "deepseek-v4", "generic-mla", "mixed")
# A few layers are enough: discovery is per module, the signature does not depend on depth.
NUM_LAYERS = {"kimi-k3": 8, "deepseek-v4": 2, "generic-mla": 2, "mixed": 12}
# Generic MLA uses the B12X transport only with the a2a comm backend at DCP 2/4/8 (the fork's
# `dcp_b12x` gate), so the models holding it run with a2a.
COMM_BACKEND = {"kimi-k3": "ag_rs", "deepseek-v4": "ag_rs", "generic-mla": "a2a", "mixed": "a2a"}
GENERIC_B12X_DCP = (2, 4, 8)


def build_for(model: str, qualification):
    return build(
        model,
        tp=qualification.tp,
        dcp=qualification.dcp,
        num_layers=NUM_LAYERS[model],
        dcp_comm_backend=COMM_BACKEND[model],
        max_num_batched_tokens=8,
    )


def context_for(qualification, world, model: str = "kimi-k3") -> WarmContext:
    return WarmContext(
        dtype="bf16",
        max_tokens=8,
        device_type=world.device.type,
        dcp_world_size=qualification.dcp,
        comm_backend=COMM_BACKEND[model],
    )


@pytest.mark.parametrize("model", MODELS)
def test_every_rank_discovers_the_same_signatures(model, qualification, world):
    built = build_for(model, qualification)
    found = discover(
        built.model,
        context=context_for(qualification, world, model),
        recognizers=recognizer_set("vendored"),
        static_forward_context=built.static_forward_context,
    )
    mine = json.dumps([s.to_json() for s in found.signatures], sort_keys=True)
    assert same_on_every_rank(mine, device=world.device), "ranks disagree"
    generic = int(qualification.dcp in GENERIC_B12X_DCP)
    expected = {"kimi-k3": 1, "deepseek-v4": 1, "generic-mla": generic, "mixed": 2 + generic}[model]
    assert len(found.signatures) == (expected if qualification.dcp > 1 else 0)


def test_kimi_k3_signature_at_the_run_geometry(qualification, world):
    built = build_for("kimi-k3", qualification)
    found = discover(
        built.model,
        context=context_for(qualification, world),
        recognizers=recognizer_set("vendored"),
        static_forward_context=built.static_forward_context,
    )
    if qualification.dcp == 1:
        assert found.signatures == ()
        return
    (sig,) = found.signatures
    local = -(-96 // qualification.tp)  # ceil: the fork pads the tail (TP9: 11 local, 99)
    assert (sig.total_heads, sig.query_head_dim, sig.output_head_dim) == (
        local * qualification.dcp,
        576,
        512,
    )
    if (qualification.tp, qualification.dcp) == (16, 16):
        assert (sig.total_heads, sig.local_heads) == (96, 6)
    if (qualification.tp, qualification.dcp) == (9, 9):  # production's padded geometry
        assert (sig.total_heads, sig.local_heads) == (99, 11)


@pytest.mark.parametrize("model", MODELS)
def test_warmup_creates_each_signature_once_and_is_idempotent(
    model, qualification, world, warm_impl_name
):
    warm_fn = resolve_warm_impl(warm_impl_name).fn
    built = build_for(model, qualification)
    context = context_for(qualification, world, model)
    with stand_in_registry(world.device, qualification.dcp) as registry:
        report = warm_fn(
            built.model,
            registry=registry,
            context=context,
            group=qualification.dcp_group,
            static_forward_context=built.static_forward_context,
        )
        after_first = registry.counters
        assert after_first.creations == report.count == len(registry.signatures())
        allocations = after_first.buffer_allocations
        # A second warmup (vLLM warms again after profiling) finds every transport ready.
        warm_fn(
            built.model,
            registry=registry,
            context=context,
            group=qualification.dcp_group,
            static_forward_context=built.static_forward_context,
        )
        assert registry.counters.creations == after_first.creations
        assert registry.counters.buffer_allocations == allocations
        # Warm per operation: every transport ran its gather and its reduction.
        for signature in registry.signatures():
            ran = {operation for operation, _ in registry.operations(signature)}
            assert ran == {"gather", "reduce"}, f"[{signature.describe()}] ran only {ran}"
    ((fewest, most),) = int_ranges([report.count], device=world.device)
    assert fewest == most, f"ranks warmed different numbers of signatures: {fewest} to {most}"
