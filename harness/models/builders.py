"""Builders for stand-in model trees at any (tp, dcp, backend, dtype, num_layers).

A built model comes with its static forward context (`{layer_name: module}`), which registers
every attention layer a second time, exactly as vLLM's compilation config does; discovery must
see both and warm each layer once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from harness.core.geometry import ParallelGeometry
from harness.core.signature import OUTPUT_DTYPES, check_dtype_name
from harness.errors import UsageError
from harness.models.backends import KimiDeltaAttentionBackend, backend_for
from harness.models.layers import (
    DecoderLayer,
    DeepseekV4Attention,
    KimiDeltaAttention,
    MLAAttention,
    MTPModule,
    MultiHeadLatentAttention,
    StandInModel,
)


@dataclass(frozen=True)
class FamilyConfig:
    """Published head geometry of a model family (what the warm code turns into signatures)."""

    num_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    default_layers: int


FAMILIES: dict[str, FamilyConfig] = {
    # Kimi-K3: 96 MLA heads, latent 512 + rope 64 = 576-wide query head, 512-wide output head.
    "kimi-k3": FamilyConfig(num_heads=96, kv_lora_rank=512, qk_rope_head_dim=64, default_layers=61),
    # DeepSeek-V4 B12X attention: 128 heads of 512 for both query and output.
    "deepseek-v4": FamilyConfig(
        num_heads=128, kv_lora_rank=512, qk_rope_head_dim=0, default_layers=61
    ),
    # Generic MLA (DeepSeek-V3 shape) through vLLM's MLAAttention.
    "generic-mla": FamilyConfig(
        num_heads=128, kv_lora_rank=512, qk_rope_head_dim=64, default_layers=61
    ),
}
MODEL_CHOICES: tuple[str, ...] = (*FAMILIES, "mixed")

KIMI_MLA_EVERY = 4  # Kimi-K3 puts MLA on every fourth decoder layer, KDA elsewhere
KDA_HEAD_DIM = 128


@dataclass(frozen=True)
class ModelSpec:
    model: str
    tp: int
    dcp: int
    backend: str = "b12x"
    dtype: str = "bf16"
    num_layers: int | None = None

    def __post_init__(self) -> None:
        if self.model not in MODEL_CHOICES:
            raise UsageError(
                f"unknown model {self.model!r}; expected one of {', '.join(MODEL_CHOICES)}"
            )
        check_dtype_name(self.dtype, allowed=OUTPUT_DTYPES)
        if self.num_layers is not None and (
            not isinstance(self.num_layers, int) or self.num_layers < 1
        ):
            raise UsageError(f"num_layers must be a positive integer, got {self.num_layers!r}")

    @property
    def geometry(self) -> ParallelGeometry:
        return ParallelGeometry(tp=self.tp, dcp=self.dcp)


@dataclass
class BuiltModel:
    """A stand-in model plus what production warmup also sees: the static forward context."""

    spec: ModelSpec
    model: nn.Module
    static_forward_context: dict[str, nn.Module] = field(default_factory=dict)

    @property
    def attention_layers(self) -> list[nn.Module]:
        """Distinct attention modules, in registration order."""
        return list({id(m): m for m in self.static_forward_context.values()}.values())


def _kimi_layer(index: int, spec: ModelSpec, prefix: str) -> DecoderLayer:
    cfg = FAMILIES["kimi-k3"]
    geom = spec.geometry
    geom.local_heads(cfg.num_heads, model="kimi-k3")
    if (index + 1) % KIMI_MLA_EVERY == 0:
        attn: nn.Module = MultiHeadLatentAttention(
            num_heads=cfg.num_heads,
            tp_size=spec.tp,
            kv_lora_rank=cfg.kv_lora_rank,
            qk_rope_head_dim=cfg.qk_rope_head_dim,
            backend=backend_for("kimi-k3", spec.backend),
            dcp_world_size=spec.dcp,
            prefix=prefix,
        )
    else:
        attn = KimiDeltaAttention(
            num_heads=cfg.num_heads,
            tp_size=spec.tp,
            head_dim=KDA_HEAD_DIM,
            backend=KimiDeltaAttentionBackend,
            dcp_world_size=spec.dcp,
            prefix=prefix,
        )
    return DecoderLayer(attn)


def _deepseek_v4_layer(index: int, spec: ModelSpec, prefix: str) -> DecoderLayer:
    cfg = FAMILIES["deepseek-v4"]
    spec.geometry.local_heads(cfg.num_heads, model="deepseek-v4")
    return DecoderLayer(
        DeepseekV4Attention(
            n_heads=cfg.num_heads,
            tp_size=spec.tp,
            head_dim=cfg.kv_lora_rank,
            backend=backend_for("deepseek-v4", spec.backend),
            prefix=prefix,
        )
    )


def _generic_mla_layer(index: int, spec: ModelSpec, prefix: str) -> DecoderLayer:
    cfg = FAMILIES["generic-mla"]
    local = spec.geometry.local_heads(cfg.num_heads, model="generic-mla")
    return DecoderLayer(
        MLAAttention(
            num_heads=local,
            kv_lora_rank=cfg.kv_lora_rank,
            qk_rope_head_dim=cfg.qk_rope_head_dim,
            backend=backend_for("generic-mla", spec.backend),
            dcp_world_size=spec.dcp,
            prefix=prefix,
        )
    )


_LAYER_BUILDERS = {
    "kimi-k3": _kimi_layer,
    "deepseek-v4": _deepseek_v4_layer,
    "generic-mla": _generic_mla_layer,
}
# The mixed model cycles through every family, so one model needs three distinct signatures.
_MIXED_CYCLE = ("kimi-k3", "deepseek-v4", "generic-mla")


def build_model(spec: ModelSpec) -> BuiltModel:
    """Build the stand-in tree for `spec`; invalid geometry raises GeometryError."""
    spec.geometry  # noqa: B018 - validates tp/dcp before any layer is built
    if spec.model == "mixed":
        num_layers = spec.num_layers or 3 * KIMI_MLA_EVERY
        families = [_MIXED_CYCLE[(i // KIMI_MLA_EVERY) % 3] for i in range(num_layers)]
    else:
        num_layers = spec.num_layers or FAMILIES[spec.model].default_layers
        families = [spec.model] * num_layers

    layers = [
        _LAYER_BUILDERS[family](i, spec, f"model.layers.{i}.self_attn")
        for i, family in enumerate(families)
    ]
    context: dict[str, nn.Module] = {}
    for layer in layers:
        attn = layer.self_attn
        name = getattr(attn, "layer_name", None) or attn.prefix
        context[name] = attn

    # The MTP/draft head re-references the last real attention layer (not KDA).
    shared = next(
        (
            layer.self_attn
            for layer in reversed(layers)
            if not isinstance(layer.self_attn, KimiDeltaAttention)
        ),
        None,
    )
    mtp = MTPModule(shared) if shared is not None else None
    if shared is not None:
        context["model.mtp.shared_attn"] = shared

    return BuiltModel(spec=spec, model=StandInModel(layers, mtp), static_forward_context=context)


def build(
    model: str,
    *,
    tp: int,
    dcp: int,
    backend: str = "b12x",
    dtype: str = "bf16",
    num_layers: int | None = None,
) -> BuiltModel:
    """Convenience form of `build_model(ModelSpec(...))`."""
    return build_model(
        ModelSpec(model=model, tp=tp, dcp=dcp, backend=backend, dtype=dtype, num_layers=num_layers)
    )
