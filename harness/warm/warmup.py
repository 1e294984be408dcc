"""Warmup: create every distinct B12X DCP transport before CUDA graph capture.

For each signature discovery returns, the transport is created through the registry (a
collective) and exercised once with dummy tensors: a query `[1, total_heads/dcp, qdim]` through
the gather and a partial output `[1, total_heads, odim]` with zero LSE through the reduction, so
that first-use work happens here and not inside capture.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from harness.core.signature import TORCH_DTYPE_ATTRS, TransportSignature
from harness.warm.discovery import DiscoveredLayer, discover
from harness.warm.protocols import DCPTransport, TransportRegistryLike
from harness.warm.recognizers import Recognizer, WarmContext, recognizer_set

logger = logging.getLogger("harness.warm")


@dataclass(frozen=True)
class WarmReport:
    """What one warmup did: how many signatures, which, and which layer kinds asked for them."""

    recognizer_set: str
    signatures: tuple[TransportSignature, ...]
    layers: tuple[DiscoveredLayer, ...]
    per_kind: Mapping[str, int]

    @property
    def count(self) -> int:
        return len(self.signatures)

    def to_json(self) -> dict[str, Any]:
        return {
            "recognizer_set": self.recognizer_set,
            "count": self.count,
            "signatures": [s.to_json() for s in self.signatures],
            "per_kind": dict(self.per_kind),
            "layers": [
                {"name": layer.name, "kind": layer.kind, "signature": layer.signature.to_json()}
                for layer in self.layers
            ],
        }


def _device(context: WarmContext) -> torch.device:
    if context.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _torch_dtype(name: str) -> torch.dtype:
    """A signature's dtype name as torch's dtype (the warm code imports nothing of the harness
    above `core`, so not the transport's own table)."""
    dtype = getattr(torch, TORCH_DTYPE_ATTRS[name])
    assert isinstance(dtype, torch.dtype)
    return dtype


def exercise(transport: DCPTransport, device: torch.device) -> None:
    """Run one dummy gather and one dummy reduction through a transport."""
    sig = transport.signature
    query = torch.zeros(
        1,
        sig.local_heads,
        sig.query_head_dim,
        dtype=_torch_dtype(str(sig.query_dtype)),
        device=device,
    )
    transport.gather_queries(query)
    partial = torch.zeros(
        1, sig.total_heads, sig.output_head_dim, dtype=_torch_dtype(sig.output_dtype), device=device
    )
    lse = torch.zeros(1, sig.total_heads, dtype=torch.float32, device=device)
    transport.reduce_outputs(partial, lse)


def warm(
    model: nn.Module,
    *,
    registry: TransportRegistryLike,
    context: WarmContext,
    group: dist.ProcessGroup | None = None,
    static_forward_context: Mapping[str, nn.Module] | None = None,
    recognizers: str | Iterable[Recognizer] = "vendored",
) -> WarmReport:
    """Discover the model's B12X DCP signatures and create one transport per signature."""
    if isinstance(recognizers, str):
        set_name, chosen = recognizers, recognizer_set(recognizers)
    else:
        chosen = tuple(recognizers)
        set_name = "+".join(r.kind for r in chosen) or "none"
    found = discover(
        model, context=context, recognizers=chosen, static_forward_context=static_forward_context
    )
    device = _device(context)
    for signature in found.signatures:
        exercise(registry.get_or_create(signature, group), device)
    logger.info("Warmed up %d B12X DCP transport signature(s).", len(found.signatures))
    return WarmReport(
        recognizer_set=set_name,
        signatures=found.signatures,
        layers=found.layers,
        per_kind=found.per_kind,
    )


def warm_before_kimi(
    model: nn.Module,
    *,
    registry: TransportRegistryLike,
    context: WarmContext,
    group: dist.ProcessGroup | None = None,
    static_forward_context: Mapping[str, nn.Module] | None = None,
) -> WarmReport:
    """The warmup as it was before the seed change: no Kimi-K3 recognizer."""
    return warm(
        model,
        registry=registry,
        context=context,
        group=group,
        static_forward_context=static_forward_context,
        recognizers="before-kimi",
    )
