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

The mistakes in `WARM_CODE_MISTAKES` are each one edit to the vendored recognizers, discovery or
`warm()`, kept here as named warms so that the suites must catch them forever. Each is harmless
on a uniform tree (every layer at TP16 and DCP > 1, one backend, reachable both ways, the
draft's key equal to the target's) and wrong on the contrast tree
(`harness.models.builders.build_contrasts`), which the capture suite runs:

- `kimi-tp-16`: Kimi-K3's local heads as `num_heads // 16` (TP hard-coded);
- `no-dcp-gate`: Kimi-K3 recognized at DCP1 too (a DCP1 transport the DCP group refuses);
- `backend-prefix`: Kimi-K3's backend matched by prefix (`B12X_MLA_EXPERIMENTAL` taken for
  `B12X_MLA`: a transport nothing uses);
- `kimi-dcp-from-impl`: Kimi-K3's DCP size read only from the impl (1 where the platform pins it);
- `forward-context-dropped`: the static forward context neither walked by discovery nor passed
  on by `warm()` (the draft's layers missed);
- `forward-context-only`: only the static forward context walked (a layer only the module tree
  holds missed);
- `draft-skipped`: forward-context entries outside the target's tree skipped (the MTP draft's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from harness.core.signature import TransportSignature
from harness.models.warm_impls import WarmFn
from harness.warm.protocols import DCPTransport, TransportRegistryLike
from harness.warm.recognizers import (
    B12X_DENSE_MLA_BACKENDS,
    DEEPSEEK_V4,
    GENERIC_MLA,
    KIMI_K3,
    Recognizer,
    WarmContext,
    backend_name,
    recognize_kimi_k3,
)
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


def _kimi_k3_mistaken(
    *,
    fixed_tp: int | None = None,
    dcp_gate: bool = True,
    backend_prefix: bool = False,
    dcp_from_impl: bool = False,
) -> Recognizer:
    """Kimi-K3's recognizer written again with one mistake (its defaults: the vendored one)."""

    def recognize(module: nn.Module, ctx: WarmContext) -> TransportSignature | None:
        name = backend_name(module) or ""
        if backend_prefix:
            matched = name.startswith(tuple(B12X_DENSE_MLA_BACKENDS))
        else:
            matched = name in B12X_DENSE_MLA_BACKENDS
        if not matched:
            return None
        attrs: Any = module  # nn.Module's attributes are typed Tensor | Module
        impl_dcp = int(getattr(getattr(module, "impl", None), "dcp_world_size", 1) or 1)
        dcp = impl_dcp if dcp_from_impl else int(getattr(module, "dcp_world_size", 0) or impl_dcp)
        if dcp_gate and dcp <= 1:
            return None
        local = int(attrs.num_heads) // fixed_tp if fixed_tp else int(attrs.num_local_heads)
        return TransportSignature(
            dtype=ctx.dtype,
            total_heads=local * dcp,
            query_head_dim=int(attrs.head_size),
            output_head_dim=int(attrs.kv_lora_rank),
            dcp_world_size=dcp,
            max_tokens=ctx.max_tokens,
            device_type=ctx.device_type,
            comm_backend=ctx.comm_backend,
        )

    return Recognizer("kimi-k3", KIMI_K3.classes, recognize, reads=KIMI_K3.reads)


Reach = Callable[
    [nn.Module, Mapping[str, nn.Module] | None],
    tuple[nn.Module, Mapping[str, nn.Module] | None],
]


def _without_forward_context(
    model: nn.Module, static_forward_context: Mapping[str, nn.Module] | None
) -> tuple[nn.Module, Mapping[str, nn.Module] | None]:
    return model, None


def _forward_context_only(
    model: nn.Module, static_forward_context: Mapping[str, nn.Module] | None
) -> tuple[nn.Module, Mapping[str, nn.Module] | None]:
    return nn.Module(), static_forward_context


def _target_registrations_only(
    model: nn.Module, static_forward_context: Mapping[str, nn.Module] | None
) -> tuple[nn.Module, Mapping[str, nn.Module] | None]:
    in_tree = {id(m) for m in model.modules()}
    kept = {n: m for n, m in (static_forward_context or {}).items() if id(m) in in_tree}
    return model, kept


def _vendored_except(
    doc: str,
    *,
    wrap_registry: Callable[[TransportRegistryLike], TransportRegistryLike] | None = None,
    recognizers: str | tuple[Recognizer, ...] = "vendored",
    keep_group: bool = True,
    reach: Reach | None = None,
) -> WarmFn:
    """The vendored `warm` with one of its steps replaced: the registry it creates through, the
    recognizers it discovers with, the DCP group it creates on (dropped: the world), or what it
    walks (the model tree and the static forward context it is handed)."""

    def broken(
        model: nn.Module,
        *,
        registry: TransportRegistryLike,
        context: WarmContext,
        group: dist.ProcessGroup | None = None,
        static_forward_context: Mapping[str, nn.Module] | None = None,
    ) -> WarmReport:
        if reach is not None:
            model, static_forward_context = reach(model, static_forward_context)
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


def _with_kimi(recognizer: Recognizer) -> tuple[Recognizer, ...]:
    return (GENERIC_MLA, DEEPSEEK_V4, recognizer)


warm_kimi_tp_16 = _vendored_except(
    "The vendored warm with Kimi-K3's local heads read as `num_heads // 16`.",
    recognizers=_with_kimi(_kimi_k3_mistaken(fixed_tp=16)),
)
warm_without_dcp_gate = _vendored_except(
    "The vendored warm with Kimi-K3 recognized at DCP1 too.",
    recognizers=_with_kimi(_kimi_k3_mistaken(dcp_gate=False)),
)
warm_backend_by_prefix = _vendored_except(
    "The vendored warm with Kimi-K3's backend matched by the prefix of `B12X_MLA`.",
    recognizers=_with_kimi(_kimi_k3_mistaken(backend_prefix=True)),
)
warm_kimi_dcp_from_impl = _vendored_except(
    "The vendored warm with Kimi-K3's DCP size read only from its impl.",
    recognizers=_with_kimi(_kimi_k3_mistaken(dcp_from_impl=True)),
)
warm_without_forward_context = _vendored_except(
    "The vendored warm without the static forward context.", reach=_without_forward_context
)
warm_forward_context_only = _vendored_except(
    "The vendored warm walking only the static forward context.", reach=_forward_context_only
)
warm_skipping_the_draft = _vendored_except(
    "The vendored warm skipping forward-context entries outside the target's tree.",
    reach=_target_registrations_only,
)

for _attr, _fn in list(globals().items()):  # `--warm-impl harness.capture.broken_warms:NAME`
    if _attr.startswith("warm_") and callable(_fn) and _fn.__name__ == "broken":
        _fn.__name__ = _fn.__qualname__ = _attr

WARM_CODE_MISTAKES: dict[str, WarmFn] = {
    "kimi-tp-16": warm_kimi_tp_16,
    "no-dcp-gate": warm_without_dcp_gate,
    "backend-prefix": warm_backend_by_prefix,
    "kimi-dcp-from-impl": warm_kimi_dcp_from_impl,
    "forward-context-dropped": warm_without_forward_context,
    "forward-context-only": warm_forward_context_only,
    "draft-skipped": warm_skipping_the_draft,
}

BROKEN_WARMS: dict[str, WarmFn] = {
    "gather-only": warm_gather_only,
    "local-heads-by-dcp": warm_local_heads_by_dcp,
    "ignores-dcp-group": warm_ignoring_dcp_group,
    **WARM_CODE_MISTAKES,
}
