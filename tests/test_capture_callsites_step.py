"""The call-site oracle's decode step and router, without vLLM: what each call site hands the
transport (the attention against an independent reference, the LSE with it, on the group it
was given), the data it makes (reproducible, different per seed, layer and rank), the exact
warm's dummy tensors, and which layers are call sites at all."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import pytest
import torch

from harness.capture.callsites import (
    CallSite,
    CallSiteKey,
    CallSiteRouter,
    ManagerCall,
    RealDecodeStep,
    call_sites,
    warm_exactly,
)
from harness.core.signature import TransportSignature
from harness.errors import UsageError

BF16 = ManagerCall(
    num_heads=6,
    query_head_dim=576,
    output_head_dim=512,
    query_dtype="bfloat16",
    output_dtype="bfloat16",
    max_num_tokens=8,
    comm_backend="ag_rs",
    dcp_world_size=1,
)
FP32 = dataclasses.replace(
    BF16, num_heads=4, query_head_dim=64, output_head_dim=32, query_dtype="float32",
    output_dtype="float32",
)  # fmt: skip
GROUP = object()  # stands in for the DCP group the router and the exact warm are given


@dataclass
class Recording:
    """A one-rank transport that keeps what it was handed."""

    signature: TransportSignature
    gathered: list[torch.Tensor] = field(default_factory=list)
    reduced: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def gather_queries(self, q: torch.Tensor) -> torch.Tensor:
        self.gathered.append(q)
        return q

    def reduce_outputs(self, out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        self.reduced.append((out, lse))
        return out


@dataclass
class Registry:
    held: dict[TransportSignature, Recording] = field(default_factory=dict)
    groups: list[object] = field(default_factory=list)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def signatures(self) -> tuple[TransportSignature, ...]:
        return tuple(sorted(self.held))

    def get(self, signature: TransportSignature) -> Recording | None:
        return self.held.get(signature)

    def get_or_create(self, signature: TransportSignature, group: object) -> Recording:
        self.groups.append(group)
        return self.held.setdefault(signature, Recording(signature))


class Manager:
    def query_gather(self, q: torch.Tensor) -> torch.Tensor:
        raise AssertionError("not routed")

    def combine(self, out: torch.Tensor, lse: torch.Tensor, **kw: object) -> torch.Tensor:
        raise AssertionError("not routed")


def sites(*calls: ManagerCall) -> tuple[CallSite, ...]:
    return tuple(
        CallSite(f"model.layers.{i}.self_attn", torch.nn.Identity(), Manager(), call)
        for i, call in enumerate(calls)
    )


def reference(query: torch.Tensor, kv: torch.Tensor, odim: int) -> tuple[list, list]:
    """Attention of each query head to the latent shard, by loops in float64."""
    q, k = query.double().tolist(), kv.double().tolist()
    outs, lses = [], []
    for b in range(len(q)):
        out_b, lse_b = [], []
        for h in range(len(q[b])):
            scores = [
                sum(x * y for x, y in zip(q[b][h], row, strict=True)) / math.sqrt(len(row))
                for row in k
            ]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            lse_b.append(top + math.log(total))
            out_b.append([sum(w * row[d] for w, row in zip(weights, k, strict=True)) / total
                          for d in range(odim)])  # fmt: skip
        outs.append(out_b)
        lses.append(lse_b)
    return outs, lses


def test_each_site_hands_over_its_attention_and_lse_on_the_given_group():
    both = sites(FP32, BF16)
    registry = Registry()
    step = RealDecodeStep(both, rank=1)
    inputs = step.make_inputs(seed=4)
    with CallSiteRouter(both, registry, group=GROUP) as router:  # type: ignore[arg-type]
        outputs = step(inputs)
    assert registry.groups == [GROUP, GROUP]  # one creation per key, on the router's group
    assert router.used == {CallSiteKey.built_for(c) for c in (FP32, BF16)}
    for site, query, kv, output in zip(both, inputs, step.kv, outputs, strict=True):
        transport = registry.held[CallSiteKey.built_for(site.call).signature()]
        [(partial, lse)] = transport.reduced
        want_out, want_lse = reference(query, kv, site.call.output_head_dim)
        tol = {"rtol": 1e-5, "atol": 1e-5} if site.call is FP32 else {"rtol": 2e-2, "atol": 2e-2}
        assert lse.shape == (2, site.call.num_heads) and lse.dtype == torch.float32
        want = torch.tensor(want_lse, dtype=torch.float64)
        torch.testing.assert_close(lse.double(), want, rtol=1e-5, atol=1e-5)
        expected = torch.tensor(want_out, dtype=torch.float64)
        torch.testing.assert_close(output.double(), expected, **tol)
        assert output is partial and output.dtype == getattr(torch, site.call.output_dtype)


def test_a_step_refuses_inputs_for_fewer_sites_than_it_has():
    step = RealDecodeStep(sites(FP32, FP32), rank=0)
    router = CallSiteRouter(step.sites, Registry(), group=None)  # type: ignore[arg-type]
    with router, pytest.raises(ValueError, match="zip"):
        step(step.make_inputs(seed=1)[:1])


def test_a_tree_without_managers_is_refused_by_name():
    with pytest.raises(UsageError) as refused:
        RealDecodeStep((), rank=0)
    assert str(refused.value) == "no layer of the real tree built a DCP manager"


@pytest.mark.parametrize(("rank", "tokens"), [(0, 3), (1, 4), (2, 5), (3, 3)])
def test_each_rank_holds_a_shard_of_its_own_length(rank, tokens):
    step = RealDecodeStep(sites(FP32, BF16), rank=rank)
    assert [tuple(kv.shape) for kv in step.kv] == [(tokens, 64), (tokens, 576)]


def test_the_data_is_reproducible_and_differs_per_seed_layer_and_rank():
    pair = sites(FP32, FP32)
    one, again, other_rank = (RealDecodeStep(pair, rank=r) for r in (0, 0, 3))
    assert all(torch.equal(a, b) for a, b in zip(one.kv, again.kv, strict=True))
    assert not torch.equal(one.kv[0], one.kv[1])  # layers
    assert not torch.equal(one.kv[0], other_rank.kv[0])  # ranks (same shard length)
    inputs = one.make_inputs(seed=7)
    assert all(torch.equal(a, b) for a, b in zip(inputs, again.make_inputs(7), strict=True))
    assert not torch.equal(inputs[0], inputs[1])
    assert not torch.equal(inputs[0], one.make_inputs(8)[0])
    assert not torch.equal(inputs[0], other_rank.make_inputs(7)[0])
    assert inputs[0].shape == (2, 4, 64) and inputs[0].dtype == torch.float32


def test_an_exact_warm_hands_each_transport_zero_tensors_of_its_own_shape_and_dtype():
    registry = Registry()
    made = warm_exactly(sites(BF16, FP32, BF16), registry, GROUP)  # type: ignore[arg-type]
    keys = [CallSiteKey.built_for(c).signature() for c in (BF16, FP32)]
    assert made == tuple(keys) and registry.groups == [GROUP, GROUP]
    assert made == tuple(registry.held)  # made maps each key once, in order
    for call, key in zip((BF16, FP32), keys, strict=True):
        transport = registry.held[key]
        dtype = getattr(torch, call.query_dtype)
        [query] = transport.gathered
        [(partial, lse)] = transport.reduced
        assert (query.shape, query.dtype, query.device.type) == (
            (1, call.num_heads, call.query_head_dim), dtype, "cpu"
        )  # fmt: skip
        assert (partial.shape, partial.dtype) == ((1, call.num_heads, call.output_head_dim), dtype)
        assert (lse.shape, lse.dtype, lse.device.type) == (
            (1, call.num_heads),
            torch.float32,
            "cpu",
        )
        assert not (query.any() or partial.any() or lse.any())


class Layer(torch.nn.Module):
    def __init__(self, *, manager: bool = True) -> None:
        super().__init__()
        if manager:
            self.dcp_manager = Manager()


def test_only_layers_whose_manager_was_recorded_are_call_sites():
    layers = {"recorded": Layer(), "unrecorded": Layer(), "none": Layer(manager=False)}
    calls = {id(layers["recorded"].dcp_manager): BF16}
    assert [s.name for s in call_sites(layers, calls)] == ["recorded"]


def test_a_key_describes_its_total_heads_and_keeps_the_device_it_is_asked_for():
    key = CallSiteKey.built_for(dataclasses.replace(BF16, dcp_world_size=4))
    assert key.describe() == (
        "24 heads x 576 -> 512 (query bfloat16, output bfloat16, dcp=4, max_tokens=8, ag_rs)"
    )
    assert key.signature("cuda").device_type == "cuda"


def test_an_unknown_dtype_name_is_refused_by_name():
    fp = dataclasses.replace(FP32, query_dtype="nonsense")
    with pytest.raises(UsageError) as refused:
        RealDecodeStep(sites(fp), rank=0).make_inputs(seed=1)
    assert str(refused.value) == "unknown torch dtype 'nonsense'"
