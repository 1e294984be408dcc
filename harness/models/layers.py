"""Stand-in attention layers mirroring the vLLM classes that B12X DCP warmup inspects.

Each class carries the attribute names the real class has (see the real
`vllm.model_executor.layers.attention.mla_attention.MLAAttention`,
`vllm.models.deepseek_v4.attention.DeepseekV4Attention`, the fork's
`vllm.models.deepseek_v4.nvidia.b12x.DeepseekV4B12xMLAAttention` and
`vllm.models.kimi_k3.nvidia.mla.MultiHeadLatentAttention`), and no real weights: projections live
on the meta device, so a 61-layer tree allocates nothing. Like the real layers, each builds its
DCP manager at construction from its own heads, dims, dtypes (the KV cache dtype decides the
query dtype) and capacity, and its decode forward calls `dcp_manager.query_gather` and
`dcp_manager.combine` (`forward_decode`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from harness.core.capacity import SEED_RUNTIME, RuntimeCapacity
from harness.models.backends import AttentionBackend
from harness.models.dcp import DCPManager, kimi_query_dtype, quantized_kv_cache

# What a layer's decode attends with: gathered queries -> (partial output, fp32 LSE).
Attend = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# DCP sizes the fork's generic-MLA B12X path supports (`dcp_b12x`).
GENERIC_B12X_DCP_SIZES = (2, 4, 8)


def _meta_linear(in_features: int, out_features: int) -> nn.Linear:
    return nn.Linear(in_features, out_features, bias=False, device="meta")


@dataclass(frozen=True)
class EngineSettings:
    """What a real layer reads from vLLM's engine config at construction: the model dtype, the
    KV cache dtype, `dcp_comm_backend` and the token capacity its DCP manager is sized for."""

    dtype: torch.dtype = torch.bfloat16
    kv_cache_dtype: str = "auto"
    dcp_comm_backend: str = "ag_rs"
    max_num_tokens: int = 64  # the engine's capacity (max_num_batched_tokens)
    # How the fork's runtime sizes the layer's B12X transport from it (the decode token cap).
    runtime: RuntimeCapacity = SEED_RUNTIME

    def manager(
        self,
        layer_name: str,
        *,
        num_heads: int,
        query_head_dim: int,
        output_head_dim: int,
        query_dtype: torch.dtype,
        b12x: bool,
    ) -> DCPManager:
        """The DCP manager a layer builds from its own heads and dims and these settings."""
        return DCPManager(
            layer_name=layer_name,
            num_heads=num_heads,
            query_head_dim=query_head_dim,
            output_head_dim=output_head_dim,
            query_dtype=query_dtype,
            output_dtype=self.dtype,
            max_num_tokens=self.runtime.tokens(self.max_num_tokens)
            if b12x
            else self.max_num_tokens,
            comm_backend=self.dcp_comm_backend,
            b12x=b12x,
        )


class MLAImpl:
    """The backend impl object; warmup reads its `dcp_world_size` (vLLM sets 1 when unset)."""

    supports_quant_query_input = False

    def __init__(self, *, num_heads: int, head_size: int, dcp_world_size: int) -> None:
        self.num_heads = num_heads
        self.head_size = head_size
        self.dcp_world_size = dcp_world_size
        self.dcp_rank = 0


class DCPLayer(nn.Module):
    """An attention layer whose decode may run through a DCP manager (None: no DCP)."""

    dcp_manager: DCPManager | None = None

    def forward_decode(self, query: torch.Tensor, attend: Attend) -> torch.Tensor:
        """Decode as the real layer does: queries in the manager's query dtype through
        `query_gather`, attention over this rank's shard, the partials through `combine`."""
        manager = self.dcp_manager
        if manager is None:
            raise RuntimeError(f"{type(self).__name__} has no DCP manager (DCP1)")
        gathered = manager.query_gather(query.to(manager.query_dtype))
        partial, lse = attend(gathered)
        return manager.combine(partial.to(manager.output_dtype), lse)


class MLAAttention(DCPLayer):
    """Generic vLLM MLA layer: `num_heads` are the *local* (per TP rank) heads.

    `dcp_b12x` is the fork's gate for the B12X DCP transport: backend `B12X_MLA_SPARSE`, comm
    backend a2a, `VLLM_USE_B12X_DCP_A2A` on, DCP in 2/4/8. Without it the layer's manager stands
    for vLLM's own collectives. The query is fp8 only under a quantized KV cache (not
    `fp8_ds_mla`) and an impl that takes quantized queries, as in vLLM.
    """

    # The model's heads before the tail padding, where the builder knows them (`num_heads` here
    # is already the local, padded count).
    original_num_attention_heads: int | None = None

    def __init__(
        self,
        *,
        num_heads: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        backend: type[AttentionBackend],
        dcp_world_size: int,
        prefix: str,
        engine: EngineSettings = EngineSettings(),
        use_b12x_dcp_a2a: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.head_size = kv_lora_rank + qk_rope_head_dim
        self.layer_name = prefix
        self.attn_backend = backend
        self.kv_cache_dtype = engine.kv_cache_dtype
        self.impl = MLAImpl(
            num_heads=num_heads, head_size=self.head_size, dcp_world_size=dcp_world_size
        )
        self.kv_b_proj = _meta_linear(kv_lora_rank, num_heads * 256)
        dcp = self.impl.dcp_world_size
        self.dcp_b12x = (
            backend.get_name() == "B12X_MLA_SPARSE"
            and engine.dcp_comm_backend == "a2a"
            and use_b12x_dcp_a2a
            and dcp in GENERIC_B12X_DCP_SIZES
        )
        self.dcp_manager = None
        if dcp > 1:
            fp8 = quantized_kv_cache(engine.kv_cache_dtype) and self.impl.supports_quant_query_input
            self.dcp_manager = engine.manager(
                prefix,
                num_heads=num_heads,
                query_head_dim=self.head_size,
                output_head_dim=kv_lora_rank,
                query_dtype=torch.float8_e4m3fn if fp8 else engine.dtype,
                b12x=self.dcp_b12x,
            )

    def get_attn_backend(self) -> type[AttentionBackend]:
        return self.attn_backend


class DeepseekV4Attention(DCPLayer):
    """DeepSeek-V4 attention: `n_local_heads` per TP rank, one 512-wide head for q and output.

    vLLM's class is abstract: each platform subclass sets the `backend_cls` class attribute, which
    `get_attn_backend()` returns (there is no `attn_backend` attribute). The base uses no DCP
    transport; the fork's B12X subclass does.
    """

    def __init__(
        self,
        *,
        n_heads: int,
        tp_size: int,
        head_dim: int,
        backend: type[AttentionBackend],
        prefix: str,
    ) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.original_num_attention_heads = n_heads  # before the tail padding
        self.n_local_heads = -(-n_heads // tp_size)  # ceil: the fork pads the tail
        self.head_dim = head_dim
        self.prefix = prefix
        self.backend_cls = backend
        self.wo_a = _meta_linear(self.n_local_heads * head_dim, 1024)

    def get_attn_backend(self) -> type[AttentionBackend]:
        return self.backend_cls


class DeepseekV4B12xMLAAttention(DeepseekV4Attention):
    """The fork's DeepSeek-V4 B12X layer (`vllm/models/deepseek_v4/nvidia/b12x.py`): backend
    `V4_B12X_SPARSE`; with DCP > 1 its decode gathers and reduces 512-wide heads in the model
    dtype through the B12X DCP transport."""

    def __init__(
        self,
        *,
        n_heads: int,
        tp_size: int,
        head_dim: int,
        backend: type[AttentionBackend],
        prefix: str,
        dcp_world_size: int,
        engine: EngineSettings = EngineSettings(),
    ) -> None:
        super().__init__(
            n_heads=n_heads, tp_size=tp_size, head_dim=head_dim, backend=backend, prefix=prefix
        )
        self.dcp_world_size = dcp_world_size
        if dcp_world_size > 1:
            self.dcp_manager = engine.manager(
                prefix,
                num_heads=self.n_local_heads,
                query_head_dim=head_dim,
                output_head_dim=head_dim,
                query_dtype=engine.dtype,
                b12x=backend.get_name() == "V4_B12X_SPARSE",
            )


class MultiHeadLatentAttention(DCPLayer):
    """Kimi-K3's native MLA adapter: an attention layer of its own, *not* an `MLAAttention`.

    `num_heads` is global, `num_local_heads` per TP rank; the DCP size sits both on the layer
    (`dcp_world_size`, from the parallel config) and on the impl. With DCP > 1 it builds its DCP
    manager (fp8 e4m3 queries under a quantized KV cache other than `fp8_ds_mla`); the manager
    uses the B12X transport when the backend is `B12X_MLA`.
    """

    def __init__(
        self,
        *,
        num_heads: int,
        tp_size: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        backend: type[AttentionBackend],
        dcp_world_size: int,
        prefix: str,
        engine: EngineSettings = EngineSettings(),
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.original_num_attention_heads = num_heads  # before the tail padding
        self.num_local_heads = -(-num_heads // tp_size)  # ceil: 11 at TP9, the tail padded
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.head_size = kv_lora_rank + qk_rope_head_dim
        self.layer_name = prefix
        self.attn_backend = backend
        self.dcp_world_size = dcp_world_size
        self.impl = MLAImpl(
            num_heads=self.num_local_heads, head_size=self.head_size, dcp_world_size=dcp_world_size
        )
        self.kv_cache = torch.tensor([])
        self.kv_cache_dtype = engine.kv_cache_dtype
        self.o_proj = _meta_linear(self.num_local_heads * 128, 1024)
        self.dcp_manager = None
        if self.dcp_world_size > 1:
            self.dcp_manager = engine.manager(
                prefix,
                num_heads=self.num_local_heads,
                query_head_dim=self.head_size,
                output_head_dim=kv_lora_rank,
                query_dtype=kimi_query_dtype(engine.kv_cache_dtype, engine.dtype),
                b12x=backend.get_name() == "B12X_MLA",
            )

    def get_attn_backend(self) -> type[AttentionBackend]:
        return self.attn_backend


class KimiDeltaAttention(nn.Module):
    """Kimi linear attention (KDA). It has heads, a head size, a layer name and a backend,
    like the MLA layers, but no DCP transport: it must never be recognized."""

    def __init__(
        self,
        *,
        num_heads: int,
        tp_size: int,
        head_dim: int,
        backend: type[AttentionBackend],
        dcp_world_size: int,
        prefix: str,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_local_heads = -(-num_heads // tp_size)
        self.head_dim = head_dim
        self.head_size = head_dim
        self.kv_lora_rank = head_dim
        self.layer_name = prefix
        self.attn_backend = backend
        self.dcp_world_size = dcp_world_size
        self.q_proj = _meta_linear(1024, self.num_local_heads * head_dim)

    def get_attn_backend(self) -> type[AttentionBackend]:
        return self.attn_backend


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = _meta_linear(1024, 2048)
        self.down = _meta_linear(2048, 1024)


class DecoderLayer(nn.Module):
    """`self_attn` + `mlp`, the shape every family shares."""

    def __init__(self, self_attn: nn.Module) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = MLP()


class MTPLayer(nn.Module):
    """One multi-token-prediction layer of a draft model: its own decoder block."""

    def __init__(self, block: DecoderLayer) -> None:
        super().__init__()
        self.eh_proj = _meta_linear(2048, 1024)
        self.mtp_block = block


class MTPDraftModel(nn.Module):
    """The MTP draft (vLLM's `KimiK3MTP` shape): a module tree of its own, *not* part of the
    target model. Its attention is reachable only through the static forward context the draft
    shares with the target, as in vLLM's proposer."""

    def __init__(self, layers: dict[int, DecoderLayer]) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleDict({str(i): MTPLayer(b) for i, b in layers.items()})


class StandInModel(nn.Module):
    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
