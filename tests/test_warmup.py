"""warm(): one transport per distinct signature, exercised once, logged and reported."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest
import torch

from harness.errors import UsageError
from harness.models import build
from harness.warm.impls import resolve_warm_impl
from harness.warm.protocols import DCPTransport, TransportRegistryLike
from harness.warm.recognizers import WarmContext
from harness.warm.signature import TransportSignature
from harness.warm.warmup import warm, warm_before_kimi


@dataclass
class RecordingTransport:
    """Shape-faithful fake: returns tensors of the right shapes and records calls."""

    signature: TransportSignature
    calls: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    def gather_queries(self, q_local: torch.Tensor) -> torch.Tensor:
        self.calls.append(("gather", tuple(q_local.shape)))
        return q_local.repeat(1, self.signature.dcp_world_size, 1)

    def reduce_outputs(self, partial_out: torch.Tensor, partial_lse: torch.Tensor) -> torch.Tensor:
        self.calls.append(("reduce", tuple(partial_out.shape)))
        assert partial_lse.dtype is torch.float32
        return partial_out[:, : self.signature.local_heads]


@dataclass
class RecordingRegistry:
    transports: dict[TransportSignature, RecordingTransport] = field(default_factory=dict)
    get_or_create_calls: int = 0

    def get_or_create(self, signature, group=None):
        self.get_or_create_calls += 1
        return self.transports.setdefault(signature, RecordingTransport(signature))

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
    assert report.per_kind == {"kimi-k3": 15}
    assert "Warmed up 1 B12X DCP transport signature(s)." in caplog.text


def test_mixed_model_warms_each_distinct_signature_once():
    built = build("mixed", tp=16, dcp=16)
    registry = RecordingRegistry()
    report = warm(
        built.model,
        registry=registry,
        context=WarmContext(dcp_world_size=16),
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


def test_warm_impls_resolve_builtins_and_dotted_paths():
    assert resolve_warm_impl("vendored").fn is warm
    assert resolve_warm_impl("before-kimi").fn is warm_before_kimi
    assert resolve_warm_impl("harness.warm.warmup:warm").fn is warm


@pytest.mark.parametrize(
    "name, message",
    [
        ("nonsense", "unknown --warm-impl 'nonsense'"),
        ("no.such.module:warm", "cannot import 'no.such.module'"),
        ("harness.warm.warmup:nope", "has no 'nope'"),
        ("harness.warm.warmup:logger", "not callable"),
        ("harness.warm.warmup:exercise", "lacks keyword parameter"),
        (":warm", "expected 'package.module:function'"),
    ],
)
def test_bad_warm_impls_are_usage_errors(name, message):
    with pytest.raises(UsageError, match=message):
        resolve_warm_impl(name)
