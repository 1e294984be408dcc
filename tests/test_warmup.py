"""warm(): one transport per distinct signature, exercised once, logged and reported."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from harness.core.signature import TransportSignature
from harness.models.builders import build
from harness.transport.dtypes import output_torch_dtype, query_torch_dtype
from harness.warm import discovery, warmup
from harness.warm.protocols import DCPTransport, TransportRegistryLike
from harness.warm.recognizers import WarmContext, recognizer_set
from harness.warm.warmup import warm, warm_before_kimi


@dataclass
class RecordingTransport:
    """A fake that checks what warmup hands it, as the real transports do, and records it.

    The dummy tensors must be what the signature's transport takes: a zero query
    `[1, h, qdim]` and a zero partial `[1, H, odim]` in the signature's dtype, a zero fp32 LSE
    `[1, H]`, all on `device`. Anything else fails the warmup under test."""

    signature: TransportSignature
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    calls: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    def _check(self, what: str, tensor: torch.Tensor, shape: tuple[int, ...], dtype) -> None:
        got = (tuple(tensor.shape), tensor.dtype, tensor.device)
        assert got == (shape, dtype, self.device), f"{what}: got {got}, expected {shape} {dtype}"
        if tensor.device.type != "meta":  # a meta tensor has no values to check
            assert not tensor.any(), f"{what}: warmup's dummy tensors are zeros"

    def gather_queries(self, q_local: torch.Tensor) -> torch.Tensor:
        sig = self.signature
        shape = (1, sig.local_heads, sig.query_head_dim)
        self._check("query", q_local, shape, query_torch_dtype(sig))
        self.calls.append(("gather", tuple(q_local.shape)))
        return q_local.repeat(1, sig.dcp_world_size, 1)

    def reduce_outputs(self, partial_out: torch.Tensor, partial_lse: torch.Tensor) -> torch.Tensor:
        sig = self.signature
        shape = (1, sig.total_heads, sig.output_head_dim)
        self._check("partial output", partial_out, shape, output_torch_dtype(sig))
        self._check("partial LSE", partial_lse, (1, sig.total_heads), torch.float32)
        self.calls.append(("reduce", tuple(partial_out.shape)))
        return partial_out[:, : sig.local_heads]


@dataclass
class RecordingRegistry:
    transports: dict[TransportSignature, RecordingTransport] = field(default_factory=dict)
    get_or_create_calls: int = 0
    groups: list[object] = field(default_factory=list)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def get_or_create(self, signature, group=None):
        self.get_or_create_calls += 1
        self.groups.append(group)
        return self.transports.setdefault(signature, RecordingTransport(signature, self.device))

    def get(self, signature):
        return self.transports.get(signature)


def test_fakes_satisfy_the_protocols():
    registry = RecordingRegistry()
    assert isinstance(registry, TransportRegistryLike)
    sig = TransportSignature("bf16", 96, 576, 512, 16)
    assert isinstance(registry.get_or_create(sig), DCPTransport)


def test_kimi_k3_warmup_creates_one_transport_and_runs_dummy_tensors(caplog):
    built = build("kimi-k3", tp=16, dcp=16)
    registry = RecordingRegistry()
    with caplog.at_level(logging.INFO, logger="harness.warm"):
        report = warm(
            built.model,
            registry=registry,
            context=WarmContext(dcp_world_size=16),
            static_forward_context=built.static_forward_context,
        )
    assert report.count == 1 and registry.get_or_create_calls == 1
    (transport,) = registry.transports.values()
    assert transport.calls == [("gather", (1, 6, 576)), ("reduce", (1, 96, 512))]
    assert report.per_kind == {"kimi-k3": 16}  # 15 target MLA layers and the MTP draft
    assert caplog.messages == ["Warmed up 1 B12X DCP transport signature(s)."]


def test_mixed_model_warms_each_distinct_signature_once():
    built = build("mixed", tp=16, dcp=8, dcp_comm_backend="a2a")
    registry = RecordingRegistry()
    report = warm(
        built.model,
        registry=registry,
        context=WarmContext(dcp_world_size=8, comm_backend="a2a"),
        static_forward_context=built.static_forward_context,
    )
    assert report.count == registry.get_or_create_calls == 3
    assert report.to_json()["count"] == 3


def test_before_kimi_warmup_misses_kimi_k3():
    built = build("kimi-k3", tp=16, dcp=16)
    registry = RecordingRegistry()
    report = warm_before_kimi(
        built.model,
        registry=registry,
        context=WarmContext(dcp_world_size=16),
        static_forward_context=built.static_forward_context,
    )
    assert report.count == 0 and registry.transports == {}
    assert report.recognizer_set == "before-kimi"


# -- what the fake checks, and what warmup must pass on ---------------------------------------


@pytest.mark.parametrize(
    "bad",
    ["query dtype", "query shape", "partial shape", "LSE dtype", "LSE shape", "nonzero"],
)
def test_the_fake_transport_refuses_wrong_dummy_tensors(bad: str, monkeypatch) -> None:
    """The checks above can fail: each wrong dummy tensor a broken `exercise` could make."""
    sig = TransportSignature("bf16", 96, 576, 512, 16)
    zeros = torch.zeros

    def wrong_zeros(*shape, dtype=None, device=None):
        if bad == "query dtype" and shape[-1] == 576:
            dtype = torch.float16
        if bad == "query shape" and shape[-1] == 576:
            shape = (1, sig.total_heads, 576)
        if bad == "partial shape" and shape[-1] == 512:
            shape = (1, sig.local_heads, 512)
        if bad == "LSE dtype" and len(shape) == 2:
            dtype = torch.bfloat16
        if bad == "LSE shape" and len(shape) == 2:
            shape = (1, sig.local_heads)
        tensor = zeros(*shape, dtype=dtype, device=device)
        return tensor + 1 if bad == "nonzero" else tensor

    monkeypatch.setattr(warmup.torch, "zeros", wrong_zeros)
    with pytest.raises(AssertionError):
        warmup.exercise(RecordingTransport(sig), torch.device("cpu"))


def test_warmup_passes_the_dcp_group_through() -> None:
    built = build("kimi-k3", tp=16, dcp=16)
    registry, group = RecordingRegistry(), object()
    warm(
        built.model,
        registry=registry,
        context=WarmContext(dcp_world_size=16),
        group=group,  # type: ignore[arg-type]
        static_forward_context=built.static_forward_context,
    )
    assert registry.groups == [group]


def test_the_device_type_reaches_the_signature() -> None:
    built = build("kimi-k3", tp=16, dcp=16)
    found = discovery.discover(
        built.model,
        context=WarmContext(dcp_world_size=16, device_type="cuda", dtype="fp16", max_tokens=32),
        recognizers=recognizer_set("vendored"),
        static_forward_context=built.static_forward_context,
    )
    (sig,) = found.signatures
    assert (sig.device_type, sig.dtype, sig.max_tokens) == ("cuda", "fp16", 32)


def _tree_only_and_context_only() -> tuple[nn.Module, dict[str, nn.Module], set]:
    """Kimi-K3 layers reachable only from the model tree, DeepSeek-V4 layers only from the
    static forward context: a warm must walk both to find both signatures."""
    kimi, dsv4 = build("kimi-k3", tp=16, dcp=16), build("deepseek-v4", tp=16, dcp=16)
    context = WarmContext(dcp_world_size=16)
    wanted = set()
    for built in (kimi, dsv4):
        found = discovery.discover(
            built.model,
            context=context,
            recognizers=recognizer_set("vendored"),
            static_forward_context=built.static_forward_context,
        )
        wanted |= set(found.signatures)
    return kimi.model, dict(dsv4.static_forward_context), wanted


def check_both_sources_warmed() -> None:
    model, forward_context, wanted = _tree_only_and_context_only()
    registry = RecordingRegistry()
    report = warm(
        model,
        registry=registry,
        context=WarmContext(dcp_world_size=16),
        static_forward_context=forward_context,
    )
    assert len(wanted) == 2
    assert set(report.signatures) == set(registry.transports) == wanted


def test_a_layer_reachable_only_one_way_is_warmed() -> None:
    check_both_sources_warmed()


@pytest.mark.parametrize("dropped", ["model tree", "forward context"])
def test_a_warm_that_drops_one_source_is_caught(dropped: str, monkeypatch) -> None:
    walk = discovery.iter_candidates

    def one_source(model, static_forward_context):
        if dropped == "model tree":
            return walk(nn.Module(), static_forward_context)
        return walk(model, None)

    monkeypatch.setattr(discovery, "iter_candidates", one_source)
    with pytest.raises(AssertionError):
        check_both_sources_warmed()


def test_the_report_says_what_was_warmed_and_by_which_kinds() -> None:
    built = build("mixed", tp=16, dcp=8, dcp_comm_backend="a2a")  # generic MLA: a2a, DCP8
    report = warm(
        built.model,
        registry=RecordingRegistry(),
        context=WarmContext(dcp_world_size=8, comm_backend="a2a"),
        static_forward_context=built.static_forward_context,
    )
    data = report.to_json()
    assert data["recognizer_set"] == "vendored" and data["count"] == 3
    assert data["signatures"] == [s.to_json() for s in report.signatures]
    assert data["per_kind"] == report.per_kind and set(data["per_kind"]) == {
        "deepseek-v4",
        "generic-mla",
        "kimi-k3",
    }
    assert len(data["layers"]) == len(report.layers) > 3
    first = data["layers"][0]
    assert set(first) == {"name", "kind", "signature"}
    assert first["signature"] == report.layers[0].signature.to_json()


def test_a_custom_recognizer_list_names_its_set() -> None:
    built = build("mixed", tp=16, dcp=8, dcp_comm_backend="a2a")  # generic MLA: a2a, DCP8
    chosen = recognizer_set("vendored")[:2]
    report = warm(
        built.model,
        registry=RecordingRegistry(),
        context=WarmContext(dcp_world_size=8, comm_backend="a2a"),
        static_forward_context=built.static_forward_context,
        recognizers=chosen,
    )
    assert report.recognizer_set == "+".join(r.kind for r in chosen)
    assert report.count == 2
    empty = warm(built.model, registry=RecordingRegistry(), context=WarmContext(), recognizers=())
    assert (empty.recognizer_set, empty.count) == ("none", 0)


def test_before_kimi_passes_group_and_forward_context_through() -> None:
    built = build("mixed", tp=16, dcp=8, dcp_comm_backend="a2a")  # generic MLA: a2a, DCP8
    registry, group = RecordingRegistry(), object()
    report = warm_before_kimi(
        built.model,
        registry=registry,
        context=WarmContext(dcp_world_size=8, comm_backend="a2a"),
        group=group,  # type: ignore[arg-type]
        static_forward_context=built.static_forward_context,
    )
    assert report.count == 2 and registry.groups == [group, group]
    assert set(report.per_kind) == {"deepseek-v4", "generic-mla"}


def test_the_warm_device_follows_the_context(monkeypatch) -> None:
    monkeypatch.setattr(warmup.torch.cuda, "current_device", lambda: 3)
    assert warmup._device(WarmContext(device_type="cuda")) == torch.device("cuda", 3)
    assert warmup._device(WarmContext(device_type="cpu")) == torch.device("cpu")


def test_the_dummy_tensors_are_made_on_the_warm_device(monkeypatch) -> None:
    """Every dummy tensor is on the context's device, not torch's default one (the CPU): a
    CUDA warm that built them on the CPU would warm nothing on the GPU. `meta` stands in for
    a device other than the default on a CPU-only machine."""
    meta = torch.device("meta")
    monkeypatch.setattr(warmup, "_device", lambda context: meta)
    built = build("kimi-k3", tp=16, dcp=16)
    registry = RecordingRegistry(device=meta)
    warm(built.model, registry=registry, context=WarmContext(dcp_world_size=16))
    (transport,) = registry.transports.values()
    assert transport.calls == [("gather", (1, 6, 576)), ("reduce", (1, 96, 512))]


@pytest.mark.parametrize("default", [torch.float64, torch.bfloat16])
def test_the_dummy_lse_is_fp32_whatever_torch_s_default_dtype(default: torch.dtype) -> None:
    """The LSE a transport takes is fp32 by contract; a model loader that changed torch's
    default dtype (vLLM loads under the model's dtype) must not change the dummy LSE."""
    built = build("kimi-k3", tp=16, dcp=16)
    registry = RecordingRegistry()
    before = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        warm(built.model, registry=registry, context=WarmContext(dcp_world_size=16))
    finally:
        torch.set_default_dtype(before)
    (transport,) = registry.transports.values()
    assert [call for call, _ in transport.calls] == ["gather", "reduce"]


def test_before_kimi_walks_the_forward_context_too() -> None:
    """The pre-seed warm still finds a layer reachable only from the static forward context
    (DeepSeek-V4 here; the Kimi-K3 layers in the tree are what it misses)."""
    model, forward_context, wanted = _tree_only_and_context_only()
    registry = RecordingRegistry()
    report = warm_before_kimi(
        model,
        registry=registry,
        context=WarmContext(dcp_world_size=16),
        static_forward_context=forward_context,
    )
    assert report.per_kind == {"deepseek-v4": len(report.layers)} and report.count == 1
    assert set(registry.transports) == set(report.signatures) < wanted
