"""Builders for stand-in model trees at any (tp, dcp, backend, dtype, num_layers).

A built model comes with its static forward context (`{layer_name: module}`), which registers
every attention layer a second time, exactly as vLLM's compilation config does; discovery must
see both and warm each layer once. The MTP draft is a separate tree (`BuiltModel.draft`), as in
vLLM: its attention layer is registered in the same forward context and nowhere in the target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from harness.core.capacity import SEED_RUNTIME, RuntimeCapacity
from harness.core.choices import FAMILY_HEADS, KV_CACHE_DTYPES, MODEL_CHOICES
from harness.core.geometry import ParallelGeometry
from harness.core.signature import (
    COMM_BACKENDS,
    DEFAULT_MAX_TOKENS,
    OUTPUT_DTYPES,
    check_dtype_name,
)
from harness.errors import UsageError
from harness.models.backends import (
    AttentionBackend,
    B12XMLABackend,
    B12XMLAExperimentalBackend,
    KimiDeltaAttentionBackend,
    backend_for,
)
from harness.models.layers import (
    DecoderLayer,
    DeepseekV4Attention,
    DeepseekV4B12xMLAAttention,
    EngineSettings,
    KimiDeltaAttention,
    MLAAttention,
    MTPDraftModel,
    MultiHeadLatentAttention,
    StandInModel,
)
from harness.transport.dtypes import torch_dtype


@dataclass(frozen=True)
class FamilyConfig:
    """Published head geometry of a model family (what the warm code turns into signatures)."""

    num_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    default_layers: int


FAMILIES: dict[str, FamilyConfig] = {
    # Kimi-K3: 96 MLA heads, latent 512 + rope 64 = 576-wide query head, 512-wide output head.
    "kimi-k3": FamilyConfig(
        num_heads=FAMILY_HEADS["kimi-k3"], kv_lora_rank=512, qk_rope_head_dim=64, default_layers=61
    ),
    # DeepSeek-V4 B12X attention: 128 heads of 512 for both query and output.
    "deepseek-v4": FamilyConfig(
        num_heads=FAMILY_HEADS["deepseek-v4"],
        kv_lora_rank=512,
        qk_rope_head_dim=0,
        default_layers=61,
    ),
    # Generic MLA (DeepSeek-V3 shape) through vLLM's MLAAttention.
    "generic-mla": FamilyConfig(
        num_heads=FAMILY_HEADS["generic-mla"],
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        default_layers=61,
    ),
}

KIMI_MLA_EVERY = 4  # Kimi-K3 puts MLA on every fourth decoder layer, KDA elsewhere
KDA_HEAD_DIM = 128


@dataclass(frozen=True)
class ModelSpec:
    """What to build, and the engine settings a real layer reads at construction: the KV cache
    dtype, vLLM's `dcp_comm_backend`, `max_num_batched_tokens` (the capacity the fork's B12X
    pools use), `VLLM_USE_B12X_DCP_A2A`, and whether the MTP draft is built."""

    model: str
    tp: int
    dcp: int
    backend: str = "b12x"
    dtype: str = "bf16"
    num_layers: int | None = None
    kv_cache_dtype: str = "auto"
    dcp_comm_backend: str = "ag_rs"
    max_num_batched_tokens: int = DEFAULT_MAX_TOKENS
    use_b12x_dcp_a2a: bool = True
    mtp: bool = True
    # How the fork's runtime caps its B12X transports' token capacity (`harness.core.capacity`).
    runtime_capacity: RuntimeCapacity = SEED_RUNTIME

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
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise UsageError(
                f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; expected one of "
                f"{', '.join(KV_CACHE_DTYPES)}"
            )
        if self.dcp_comm_backend not in COMM_BACKENDS:
            raise UsageError(
                f"unknown dcp_comm_backend {self.dcp_comm_backend!r}; expected one of "
                f"{', '.join(COMM_BACKENDS)}"
            )
        if not isinstance(self.max_num_batched_tokens, int) or self.max_num_batched_tokens < 1:
            raise UsageError(
                "max_num_batched_tokens must be a positive integer, got "
                f"{self.max_num_batched_tokens!r}"
            )

    @property
    def geometry(self) -> ParallelGeometry:
        return ParallelGeometry(tp=self.tp, dcp=self.dcp)

    @property
    def engine(self) -> EngineSettings:
        """The settings every layer of the tree reads at construction."""
        return EngineSettings(
            dtype=torch_dtype(self.dtype),
            kv_cache_dtype=self.kv_cache_dtype,
            dcp_comm_backend=self.dcp_comm_backend,
            max_num_tokens=self.max_num_batched_tokens,
            runtime=self.runtime_capacity,
        )


@dataclass
class BuiltModel:
    """A stand-in model plus what production warmup also sees: the static forward context."""

    spec: ModelSpec
    model: nn.Module
    static_forward_context: dict[str, nn.Module] = field(default_factory=dict)
    draft: nn.Module | None = None  # the MTP draft's own tree, outside `model`

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
            engine=spec.engine,
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
    backend = backend_for("deepseek-v4", spec.backend)
    if spec.backend != "b12x":  # another platform subclass: no B12X DCP transport
        return DecoderLayer(
            DeepseekV4Attention(
                n_heads=cfg.num_heads,
                tp_size=spec.tp,
                head_dim=cfg.kv_lora_rank,
                backend=backend,
                prefix=prefix,
            )
        )
    return DecoderLayer(
        DeepseekV4B12xMLAAttention(
            n_heads=cfg.num_heads,
            tp_size=spec.tp,
            head_dim=cfg.kv_lora_rank,
            backend=backend,
            prefix=prefix,
            dcp_world_size=spec.dcp,
            engine=spec.engine,
        )
    )


def _generic_mla_layer(index: int, spec: ModelSpec, prefix: str) -> DecoderLayer:
    cfg = FAMILIES["generic-mla"]
    local = spec.geometry.local_heads(cfg.num_heads, model="generic-mla")
    attn = MLAAttention(
        num_heads=local,
        kv_lora_rank=cfg.kv_lora_rank,
        qk_rope_head_dim=cfg.qk_rope_head_dim,
        backend=backend_for("generic-mla", spec.backend),
        dcp_world_size=spec.dcp,
        prefix=prefix,
        engine=spec.engine,
        use_b12x_dcp_a2a=spec.use_b12x_dcp_a2a,
    )
    attn.original_num_attention_heads = cfg.num_heads  # the model's, before the tail padding
    return DecoderLayer(attn)


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
        _register(context, layer.self_attn)

    # The MTP draft: one more decoder layer of the last MLA family, numbered after the target's
    # layers, in a tree of its own; only the shared forward context reaches its attention.
    draft = None
    mla = [f for f in families if f in _MLA_FAMILIES]
    if spec.mtp and mla:
        index = num_layers
        block = _draft_layer(mla[-1], index, spec, f"model.layers.{index}.self_attn")
        draft = MTPDraftModel({index: block})
        _register(context, block.self_attn)

    return BuiltModel(
        spec=spec, model=StandInModel(layers), static_forward_context=context, draft=draft
    )


_MLA_FAMILIES = frozenset(_LAYER_BUILDERS)


def _draft_layer(family: str, index: int, spec: ModelSpec, prefix: str) -> DecoderLayer:
    """A decoder layer of `family` that is MLA whatever its index (Kimi-K3's MTP block is)."""
    if family == "kimi-k3":
        index = KIMI_MLA_EVERY - 1
    return _LAYER_BUILDERS[family](index, spec, prefix)


def _register(context: dict[str, nn.Module], attn: nn.Module) -> None:
    name = str(getattr(attn, "layer_name", None) or attn.prefix)
    if name in context:
        raise ValueError(f"Duplicate layer name: {name}")  # vLLM refuses it too
    context[name] = attn


def build(model: str, *, tp: int, dcp: int, **settings: Any) -> BuiltModel:
    """Convenience form of `build_model(ModelSpec(...))`; `settings` are ModelSpec fields."""
    return build_model(ModelSpec(model=model, tp=tp, dcp=dcp, **settings))


CONTRASTS = "contrasts"  # the tree `build_contrasts` makes (not a model family)
CONTRAST_TP = 16  # the target's tp; its draft and its prefix-named layer run at others
CONTRAST_DRAFT_TP = 8
CONTRAST_PREFIX_TP = 4
CONTRAST_DCP_SIZES = (2, 4)  # dcp must divide every tp of the tree (4 is the smallest)


def build_contrasts(
    *,
    dcp: int,
    dtype: str = "bf16",
    max_num_batched_tokens: int = DEFAULT_MAX_TOKENS,
    runtime_capacity: RuntimeCapacity = SEED_RUNTIME,
) -> BuiltModel:
    """One tree whose layers differ in each thing the warm code reads, so that a warm-code
    mistake that is harmless on a uniform tree (every layer at TP16, DCP > 1, one backend,
    reachable both ways, the draft's key equal to the target's) warms the wrong keys here.

    - `model.layers.0`: Kimi-K3 at TP16/DCP`dcp`, B12X_MLA, in the tree and the forward context,
      its impl at DCP1 (as vLLM 0.32's `CPUMLAImpl` pins it): the layer's own DCP size decides;
    - `model.layers.1`: Kimi-K3 at DCP1 beside it: no DCP manager, nothing to warm;
    - `model.layers.2`: Kimi-K3 at TP4 with backend `B12X_MLA_EXPERIMENTAL`: not B12X_MLA, no
      transport (a warm that matched by prefix would warm its key, which nothing uses);
    - `model.layers.3`: DeepSeek-V4's B12X layer in the module tree only (not in the forward
      context), its key of its own;
    - the MTP draft: Kimi-K3 at TP8, in the forward context only, impl at DCP1 like the target.
      Its key differs from the target's through its local heads: vLLM 0.32 allows a draft TP of
      1 or the target's only, and its real-world own key (its KV dtype) is one the vendored warm
      code misses anyway (README); TP8 is the stand-in's way to give the draft a key of its own
      that a correct warm covers.

    Transport keys at DCP d: 6d heads x 576 -> 512 (target), 12d heads x 576 -> 512 (draft),
    8d heads x 512 -> 512 (DeepSeek-V4). `dcp` must be one of `CONTRAST_DCP_SIZES`.
    """
    if dcp not in CONTRAST_DCP_SIZES:
        raise UsageError(f"the contrast tree runs at dcp in {CONTRAST_DCP_SIZES}, got {dcp}")

    def spec(tp: int, layer_dcp: int = dcp, backend: str = "b12x") -> ModelSpec:
        return ModelSpec(
            model="kimi-k3",
            tp=tp,
            dcp=layer_dcp,
            backend=backend,
            dtype=dtype,
            max_num_batched_tokens=max_num_batched_tokens,
            runtime_capacity=runtime_capacity,
        )

    def kimi(
        tp: int,
        prefix: str,
        *,
        layer_dcp: int = dcp,
        impl_dcp: int | None = None,
        backend: type[AttentionBackend] = B12XMLABackend,
    ) -> DecoderLayer:
        cfg, where = FAMILIES["kimi-k3"], spec(tp, layer_dcp)
        where.geometry.local_heads(cfg.num_heads, model="kimi-k3")  # tp and dcp checked
        attn = MultiHeadLatentAttention(
            num_heads=cfg.num_heads,
            tp_size=tp,
            kv_lora_rank=cfg.kv_lora_rank,
            qk_rope_head_dim=cfg.qk_rope_head_dim,
            backend=backend,
            dcp_world_size=layer_dcp,
            prefix=prefix,
            engine=where.engine,
        )
        if impl_dcp is not None:
            attn.impl.dcp_world_size = impl_dcp
        return DecoderLayer(attn)

    target = kimi(CONTRAST_TP, "model.layers.0.self_attn", impl_dcp=1)
    dcp1 = kimi(CONTRAST_TP, "model.layers.1.self_attn", layer_dcp=1)
    prefixed = kimi(
        CONTRAST_PREFIX_TP, "model.layers.2.self_attn", backend=B12XMLAExperimentalBackend
    )
    module_only = _deepseek_v4_layer(3, spec(CONTRAST_TP), "model.layers.3.self_attn")
    layers = [target, dcp1, prefixed, module_only]
    context: dict[str, nn.Module] = {}
    for layer in layers[:3]:
        _register(context, layer.self_attn)
    draft_block = kimi(CONTRAST_DRAFT_TP, "model.layers.4.self_attn", impl_dcp=1)
    _register(context, draft_block.self_attn)
    return BuiltModel(
        spec=spec(CONTRAST_TP),
        model=StandInModel(layers),
        static_forward_context=context,
        draft=MTPDraftModel({4: draft_block}),
    )
