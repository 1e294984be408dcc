"""Deliberately wrong warm implementations, for negative controls that must catch them.

Each has the vendored `warm`'s signature, so it also works as `dcpqual run --warm-impl
harness.capture.broken_warms:NAME`. Each is a realistic bug that passes at TP16/DCP16 or
passes a check that only counts transports:

- `warm_gather_only`: creates every transport but runs only the query gather. The transport
  exists before capture, yet the reduction's kernels would specialize lazily inside it (b12x
  compiles per operation and dtype): the registry's first-use report must catch it.
- `warm_local_heads_by_dcp`: Kimi-K3's local heads computed as `num_heads // dcp` instead of
  `num_heads // tp`. Equal when tp == dcp (TP16/DCP16); at TP16/DCP4 it warms 96 heads where
  the layer gathers 24, so the real transport is created lazily.
- `warm_ignoring_dcp_group`: creates the transports on the world instead of the DCP group.
  The same when the DCP group is the whole world; refused by the registry when it is a proper
  subgroup (the signature's DCP size does not match the group).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from harness.warm.impls import WarmFn
from harness.warm.protocols import DCPTransport, TransportRegistryLike
from harness.warm.recognizers import (
    DEEPSEEK_V4,
    GENERIC_MLA,
    KIMI_K3,
    Recognizer,
    WarmContext,
    recognize_kimi_k3,
)
from harness.warm.signature import TransportSignature
from harness.warm.warmup import WarmReport, warm


class _GatherOnlyTransport:
    """A transport whose reduction does nothing (what a gather-only warm leaves behind)."""

    def __init__(self, inner: DCPTransport) -> None:
        self._inner = inner
        self.signature = inner.signature

    def gather_queries(self, q_local: torch.Tensor) -> torch.Tensor:
        return self._inner.gather_queries(q_local)

    def reduce_outputs(self, partial_out: torch.Tensor, partial_lse: torch.Tensor) -> torch.Tensor:
        return partial_out[:, : self.signature.local_heads]


class _GatherOnlyRegistry:
    """Hands out the real transports, wrapped so the warm code's reduction never runs."""

    def __init__(self, inner: TransportRegistryLike) -> None:
        self._inner = inner

    def get_or_create(
        self, signature: TransportSignature, group: dist.ProcessGroup | None = None
    ) -> DCPTransport:
        return _GatherOnlyTransport(self._inner.get_or_create(signature, group))

    def get(self, signature: TransportSignature) -> DCPTransport | None:
        found = self._inner.get(signature)
        return None if found is None else _GatherOnlyTransport(found)


def _kimi_local_heads_by_dcp(module: nn.Module, ctx: WarmContext) -> TransportSignature | None:
    signature = recognize_kimi_k3(module, ctx)
    if signature is None:
        return None
    dcp = signature.dcp_world_size
    num_heads: Any = module.num_heads  # nn.Module's attributes are typed Tensor | Module
    return dataclasses.replace(signature, total_heads=int(num_heads) // dcp * dcp)


KIMI_K3_LOCAL_HEADS_BY_DCP = Recognizer(
    "kimi-k3", KIMI_K3.classes, _kimi_local_heads_by_dcp, reads=(*KIMI_K3.reads, "num_heads")
)


def _vendored_except(
    doc: str,
    *,
    wrap_registry: Callable[[TransportRegistryLike], TransportRegistryLike] | None = None,
    recognizers: str | tuple[Recognizer, ...] = "vendored",
    keep_group: bool = True,
) -> WarmFn:
    """The vendored `warm` with one of its steps replaced: the registry it creates through, the
    recognizers it discovers with, or the DCP group it creates on (dropped: the world)."""

    def broken(
        model: nn.Module,
        *,
        registry: TransportRegistryLike,
        context: WarmContext,
        group: dist.ProcessGroup | None = None,
        static_forward_context: Mapping[str, nn.Module] | None = None,
    ) -> WarmReport:
        return warm(
            model,
            registry=registry if wrap_registry is None else wrap_registry(registry),
            context=context,
            group=group if keep_group else None,
            static_forward_context=static_forward_context,
            recognizers=recognizers,
        )

    broken.__doc__ = doc
    return broken


warm_gather_only = _vendored_except(
    "Create every transport, exercise only its gather.", wrap_registry=_GatherOnlyRegistry
)
warm_local_heads_by_dcp = _vendored_except(
    "The vendored warm with Kimi-K3's local heads read as `num_heads // dcp`.",
    recognizers=(GENERIC_MLA, DEEPSEEK_V4, KIMI_K3_LOCAL_HEADS_BY_DCP),
)
warm_ignoring_dcp_group = _vendored_except(
    "The vendored warm with the DCP group dropped (transports created on the world).",
    keep_group=False,
)

BROKEN_WARMS: dict[str, WarmFn] = {
    "gather-only": warm_gather_only,
    "local-heads-by-dcp": warm_local_heads_by_dcp,
    "ignores-dcp-group": warm_ignoring_dcp_group,
}
