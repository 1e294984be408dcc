"""Recognizers: turn one attention module into the B12X DCP transport signature it needs.

Vendored from the production warm code. Classes are matched by qualified name anywhere in the
module's MRO, so the same recognizer accepts vLLM's real class, a subclass of it, and our stand-in
(`harness.models.layers`), without importing vLLM.

Two sets are kept by name:
- `vendored`: after the seed change "Warm Kimi B12X MLA DCP transport" (Kimi-K3's native adapter
  recognized);
- `before-kimi`: the set before it, which misses Kimi-K3 and lets its transport be created lazily
  during capture. The capture suite's negative control needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from harness.core.signature import TransportSignature
from harness.errors import UsageError


@dataclass(frozen=True)
class WarmContext:
    """What production warmup knows from the engine config rather than from a layer."""

    dtype: str = "bf16"  # model_config.dtype: production warms one dtype for query and output
    max_tokens: int = 64  # max_num_batched_tokens
    device_type: str = "cpu"
    dcp_world_size: int = 1  # parallel_config.decode_context_parallel_size
    comm_backend: str = "ag_rs"  # parallel_config.dcp_comm_backend


B12X_DENSE_MLA_BACKENDS = frozenset({"B12X_MLA"})
B12X_DSV4_BACKENDS = frozenset({"V4_B12X_SPARSE"})

GENERIC_MLA_CLASSES = frozenset(
    {
        "vllm.model_executor.layers.attention.mla_attention.MLAAttention",
        "harness.models.layers.MLAAttention",
    }
)
DEEPSEEK_V4_CLASSES = frozenset(
    {
        "vllm.models.deepseek_v4.attention.DeepseekV4Attention",
        "vllm.models.deepseek_v4.nvidia.b12x.DeepseekV4B12xMLAAttention",
        "harness.models.layers.DeepseekV4Attention",
    }
)
KIMI_K3_CLASSES = frozenset(
    {
        "vllm.models.kimi_k3.nvidia.mla.MultiHeadLatentAttention",
        "harness.models.layers.MultiHeadLatentAttention",
    }
)


def backend_name(module: nn.Module) -> str | None:
    """Name of the backend a layer selected, via `get_attn_backend()` or `attn_backend`."""
    getter = getattr(module, "get_attn_backend", None)
    backend = getter() if callable(getter) else getattr(module, "attn_backend", None)
    get_name = getattr(backend, "get_name", None)
    return str(get_name()) if callable(get_name) else None


def _impl_dcp(module: nn.Module) -> int:
    return int(getattr(getattr(module, "impl", None), "dcp_world_size", 1) or 1)


def _signature(
    ctx: WarmContext, *, local_heads: int, dcp: int, qdim: int, odim: int
) -> TransportSignature:
    return TransportSignature(
        dtype=ctx.dtype,
        total_heads=local_heads * dcp,
        query_head_dim=qdim,
        output_head_dim=odim,
        dcp_world_size=dcp,
        max_tokens=ctx.max_tokens,
        device_type=ctx.device_type,
        comm_backend=ctx.comm_backend,
    )


def _int(module: nn.Module, name: str) -> int:
    """An integer attribute of the layer (`nn.Module.__getattr__` is typed Tensor | Module)."""
    value: Any = getattr(module, name)
    return int(value)


def _mla_signature(
    module: nn.Module, ctx: WarmContext, *, heads: str, dcp: int
) -> TransportSignature:
    """An MLA layer's transport: its local heads (read from `heads`) x dcp, the query head
    `head_size` (576) gathered, the latent `kv_lora_rank` (512) reduced."""
    return _signature(
        ctx,
        local_heads=_int(module, heads),
        dcp=dcp,
        qdim=_int(module, "head_size"),
        odim=_int(module, "kv_lora_rank"),
    )


def recognize_generic_mla(module: nn.Module, ctx: WarmContext) -> TransportSignature | None:
    """vLLM `MLAAttention` behind the fork's `dcp_b12x` gate: local heads x dcp, 576 -> 512."""
    if not getattr(module, "dcp_b12x", False):
        return None
    dcp = _impl_dcp(module)
    if dcp <= 1:
        return None
    return _mla_signature(module, ctx, heads="num_heads", dcp=dcp)


def recognize_deepseek_v4(module: nn.Module, ctx: WarmContext) -> TransportSignature | None:
    """DeepSeek-V4 B12X attention: n_local_heads x dcp, head_dim for query and output."""
    if backend_name(module) not in B12X_DSV4_BACKENDS:
        return None
    dcp = ctx.dcp_world_size
    if dcp <= 1:
        return None
    head_dim = _int(module, "head_dim")
    return _signature(
        ctx, local_heads=_int(module, "n_local_heads"), dcp=dcp, qdim=head_dim, odim=head_dim
    )


def recognize_kimi_k3(module: nn.Module, ctx: WarmContext) -> TransportSignature | None:
    """Kimi-K3's native MLA adapter (the seed change): num_local_heads x dcp, 576 -> 512.

    Kimi-K3 calls its attention adapter directly instead of going through `MLAAttention`, so
    the generic recognizer never sees it.
    """
    if backend_name(module) not in B12X_DENSE_MLA_BACKENDS:
        return None
    dcp = int(getattr(module, "dcp_world_size", 0) or _impl_dcp(module))
    if dcp <= 1:
        return None
    return _mla_signature(module, ctx, heads="num_local_heads", dcp=dcp)


RecognizeFn = Callable[[nn.Module, WarmContext], TransportSignature | None]


@dataclass(frozen=True)
class Recognizer:
    """A layer kind: the classes it accepts, how it reads them, and which attributes it reads
    (checked against the real vLLM classes by the compat suite, so an upstream rename fails)."""

    kind: str
    classes: frozenset[str]
    recognize: RecognizeFn
    reads: tuple[str, ...]


GENERIC_MLA = Recognizer(
    "generic-mla",
    GENERIC_MLA_CLASSES,
    recognize_generic_mla,
    reads=("dcp_b12x", "impl.dcp_world_size", "num_heads", "head_size", "kv_lora_rank"),
)
DEEPSEEK_V4 = Recognizer(
    "deepseek-v4",
    DEEPSEEK_V4_CLASSES,
    recognize_deepseek_v4,
    reads=("get_attn_backend", "n_local_heads", "head_dim"),
)
KIMI_K3 = Recognizer(
    "kimi-k3",
    KIMI_K3_CLASSES,
    recognize_kimi_k3,
    reads=(
        "get_attn_backend",
        "dcp_world_size",
        "impl.dcp_world_size",
        "num_local_heads",
        "head_size",
        "kv_lora_rank",
    ),
)

RECOGNIZER_SETS: dict[str, tuple[Recognizer, ...]] = {
    "vendored": (GENERIC_MLA, DEEPSEEK_V4, KIMI_K3),
    "before-kimi": (GENERIC_MLA, DEEPSEEK_V4),
}


def recognizer_set(name: str) -> tuple[Recognizer, ...]:
    try:
        return RECOGNIZER_SETS[name]
    except KeyError:
        raise UsageError(
            f"unknown recognizer set {name!r}; expected one of {', '.join(RECOGNIZER_SETS)}"
        ) from None


def qualified_names(cls: type[Any]) -> tuple[str, ...]:
    """`module.QualName` of every class in `cls`'s MRO."""
    return tuple(f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__)
