"""The call-site oracle without vLLM: keys come from the tensors a call site hands over and the
manager's recorded construction, so a warm that computed a wrong dtype or capacity is caught."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from harness.capture.callsites import (
    CallSite,
    CallSiteKey,
    CallSiteRouter,
    ManagerCall,
    RealDecodeStep,
    watch_managers,
)
from harness.core.capacity import RuntimeCapacity
from harness.core.signature import TransportSignature

CALL = ManagerCall(
    num_heads=6,
    query_head_dim=576,
    output_head_dim=512,
    query_dtype="bfloat16",
    output_dtype="bfloat16",
    max_num_tokens=8,
    comm_backend="ag_rs",
    dcp_world_size=1,
)


class OneRankTransport:
    """A DCP group of one: the gather and the reduction are identities."""

    def __init__(self, signature: TransportSignature) -> None:
        self.signature = signature

    def gather_queries(self, q: torch.Tensor) -> torch.Tensor:
        return q

    def reduce_outputs(self, out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        return out


@dataclass
class FakeRegistry:
    held: dict[TransportSignature, OneRankTransport] = field(default_factory=dict)
    created: list[TransportSignature] = field(default_factory=list)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def warm(self, signature: TransportSignature) -> None:
        self.held[signature] = OneRankTransport(signature)

    def signatures(self) -> tuple[TransportSignature, ...]:
        return tuple(sorted(self.held))

    def get(self, signature: TransportSignature) -> OneRankTransport | None:
        return self.held.get(signature)

    def get_or_create(self, signature: TransportSignature, group: object) -> OneRankTransport:
        self.created.append(signature)
        self.warm(signature)
        return self.held[signature]


class Manager:
    """Stands in for an MLADCPManager instance: the router replaces these two attributes."""

    def query_gather(self, q: torch.Tensor) -> torch.Tensor:
        raise AssertionError("vLLM's own gather must not run: it was not routed")

    def combine(self, out: torch.Tensor, lse: torch.Tensor, **kw: object) -> torch.Tensor:
        raise AssertionError("vLLM's own combine must not run: it was not routed")


def key(**changes: object) -> CallSiteKey:
    base = dict(
        local_heads=6,
        query_head_dim=576,
        output_head_dim=512,
        query_dtype="bfloat16",
        output_dtype="bfloat16",
        max_tokens=8,
        comm_backend="ag_rs",
        dcp_world_size=1,
    )
    return CallSiteKey(**{**base, **changes})  # type: ignore[arg-type]


def run_step(registry: FakeRegistry) -> CallSiteRouter:
    site = CallSite("model.layers.0.self_attn", torch.nn.Identity(), Manager(), CALL)
    step = RealDecodeStep((site,), rank=0)
    with CallSiteRouter((site,), registry, group=None) as router:  # type: ignore[arg-type]
        outputs = step(step.make_inputs(seed=1))
    assert outputs[0].shape == (2, 6, 512) and outputs[0].dtype == torch.bfloat16
    assert site.manager.query_gather.__func__ is Manager.query_gather, "router must restore"
    return router


def test_a_warm_of_the_right_key_serves_every_call():
    registry = FakeRegistry()
    registry.warm(key().signature())
    router = run_step(registry)
    assert registry.created == [] and router.served == {key().signature()}


def test_a_larger_warmed_capacity_does_not_serve_the_call_site():
    """Fork registries look transports up by exact capacity: a warm sized by
    max_num_batched_tokens (2048) leaves the runtime's 8-token key to be created in capture."""
    registry = FakeRegistry()
    registry.warm(key(max_tokens=2048).signature())
    router = run_step(registry)
    assert registry.created == [key().signature()]
    assert router.served == {key().signature()}


@pytest.mark.parametrize(
    "wrong",
    [
        {"max_tokens": 4},
        {"max_tokens": 16},
        {"query_dtype": "float16", "output_dtype": "float16"},
        {"local_heads": 12},
        {"comm_backend": "a2a"},
    ],
    ids=["capacity-too-small", "capacity-too-large", "wrong-dtype", "wrong-heads", "wrong-comm"],
)
def test_a_warm_that_computed_a_wrong_key_is_caught_as_a_creation(wrong):
    registry = FakeRegistry()
    registry.warm(key(**wrong).signature())
    router = run_step(registry)
    assert registry.created == [key().signature()]
    assert key() in router.used


def test_an_fp8_query_key_keeps_its_own_dtype_beside_the_output_dtype():
    fp8 = key(query_dtype="float8_e4m3fn", comm_backend="a2a").signature()
    assert (fp8.query_dtype, fp8.output_dtype, fp8.comm_backend) == ("fp8_e4m3fn", "bf16", "a2a")


def test_a_warm_that_ignores_the_query_dtype_is_caught_under_fp8():
    fp8_call = dataclasses.replace(CALL, query_dtype="float8_e4m3fn")
    registry = FakeRegistry()
    registry.warm(key().signature())  # bf16 queries: the dtype of the model, not of the cache
    site = CallSite("model.layers.0.self_attn", torch.nn.Identity(), Manager(), fp8_call)
    step = RealDecodeStep((site,), rank=0)
    with CallSiteRouter((site,), registry, group=None):  # type: ignore[arg-type]
        step(step.make_inputs(seed=3))
    assert registry.created == [key(query_dtype="float8_e4m3fn").signature()]


class GatedLayer(torch.nn.Module):
    """A generic-MLA-shaped layer: its manager, and the fork's `dcp_b12x` gate (None: absent)."""

    def __init__(self, gate: bool | None) -> None:
        super().__init__()
        self.dcp_manager = object()
        if gate is not None:
            self.dcp_b12x = gate


def test_a_layer_whose_b12x_gate_is_closed_is_not_a_call_site():
    from harness.capture.callsites import call_sites

    layers = {"open": GatedLayer(True), "closed": GatedLayer(False), "ungated": GatedLayer(None)}
    calls = {id(layer.dcp_manager): CALL for layer in layers.values()}
    assert [site.name for site in call_sites(layers, calls)] == ["open", "ungated"]


def test_an_exact_warm_makes_what_each_manager_was_built_for_and_skips_what_it_is_told():
    from harness.capture.callsites import warm_exactly

    fp8 = dataclasses.replace(CALL, query_dtype="float8_e4m3fn")
    sites = (
        CallSite("model.layers.0.self_attn", torch.nn.Identity(), Manager(), CALL),
        CallSite("model.layers.1.self_attn", torch.nn.Identity(), Manager(), CALL),
        CallSite("mtp.layers.0.self_attn", torch.nn.Identity(), Manager(), fp8),
    )
    registry = FakeRegistry()
    made = warm_exactly(sites, registry, group=None)  # type: ignore[arg-type]
    assert made == (key().signature(), key(query_dtype="float8_e4m3fn").signature())
    skipped = FakeRegistry()
    assert warm_exactly(sites, skipped, None, skip=frozenset({"mtp.layers.0.self_attn"})) == (  # type: ignore[arg-type]
        key().signature(),
    )
    assert run_step(skipped).served == {key().signature()}


@pytest.mark.parametrize(
    ("runtime", "expected"),
    [(RuntimeCapacity(), 8), (RuntimeCapacity("engine", 4), 4), (RuntimeCapacity("decode-cap"), 8)],
)
def test_the_oracle_records_the_runtime_capacity_of_each_manager(
    monkeypatch: pytest.MonkeyPatch, runtime: RuntimeCapacity, expected: int
) -> None:
    """What a manager was sized to (vLLM: 8 tokens here) under the fork's runtime token cap."""
    dcp = pytest.importorskip("vllm.v1.attention.ops.dcp")

    def sized(self, *args, **kwargs):  # vLLM's constructor, reduced to what is recorded
        self.max_num_tokens, self.use_a2a = 8, False
        self.group = SimpleNamespace(world_size=2)

    monkeypatch.setattr(dcp.MLADCPManager, "__init__", sized)
    with watch_managers(runtime) as calls:
        manager = dcp.MLADCPManager(None, None, 6, 576, 512, torch.bfloat16, torch.bfloat16)
    assert calls[id(manager)].max_num_tokens == expected


class DraftedLayer(torch.nn.Module):
    """A Kimi-K3-shaped layer: a manager of its own, no gate."""

    def __init__(self) -> None:
        super().__init__()
        self.dcp_manager = Manager()


def test_the_drafts_layers_are_call_sites_with_their_own_key():
    """The draft's layer is a registration of the forward context like the target's, not a
    module of the target: its manager, built at the draft's own KV dtype (fp8 queries), is a
    call site of its own, and a warm of the target's key alone is caught creating the draft's."""
    from harness.capture.callsites import call_sites

    target = torch.nn.ModuleList([DraftedLayer(), DraftedLayer()])
    draft = DraftedLayer()  # its own tree, reachable only through the forward context
    context = {
        "model.layers.0.self_attn": target[0],
        "model.layers.1.self_attn": target[1],
        "model.layers.2.self_attn": draft,
    }
    fp8 = dataclasses.replace(CALL, query_dtype="float8_e4m3fn")
    calls = {id(target[0].dcp_manager): CALL, id(target[1].dcp_manager): CALL}
    calls[id(draft.dcp_manager)] = fp8
    sites = call_sites(context, calls)
    assert [(s.name, s.call) for s in sites] == [
        ("model.layers.0.self_attn", CALL),
        ("model.layers.1.self_attn", CALL),
        ("model.layers.2.self_attn", fp8),
    ]
    assert sites[2].layer is draft and sites[2].manager is draft.dcp_manager
    registry = FakeRegistry()
    registry.warm(key().signature())  # the target's key only
    step = RealDecodeStep(sites, rank=0)
    with CallSiteRouter(sites, registry, group=None) as router:  # type: ignore[arg-type]
        step(step.make_inputs(seed=5))
    assert registry.created == [key(query_dtype="float8_e4m3fn").signature()]
    assert set(router.used) == {key(), key(query_dtype="float8_e4m3fn")}
