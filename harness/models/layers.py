"""Stand-in attention layers mirroring the vLLM classes that B12X DCP warmup inspects.

Each class carries exactly the attribute names the real class has (see the real
`vllm.model_executor.layers.attention.mla_attention.MLAAttention`,
`vllm.models.deepseek_v4.attention.DeepseekV4Attention` and
`vllm.models.kimi_k3.nvidia.mla.MultiHeadLatentAttention`), and no real weights: projections live
on the meta device, so a 61-layer tree allocates nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from harness.models.backends import AttentionBackend


def _meta_linear(in_features: int, out_features: int) -> nn.Linear:
    return nn.Linear(in_features, out_features, bias=False, device="meta")


class MLAImpl:
    """The backend impl object; warmup reads its `dcp_world_size` (vLLM sets -1 when unset)."""

    def __init__(self, *, num_heads: int, head_size: int, dcp_world_size: int) -> None:
        self.num_heads = num_heads
        self.head_size = head_size
        self.dcp_world_size = dcp_world_size
        self.dcp_rank = 0


class MLAAttention(nn.Module):
    """Generic vLLM MLA layer: `num_heads` are the *local* (per TP rank) heads."""

    def __init__(
        self,
        *,
        num_heads: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        backend: type[AttentionBackend],
        dcp_world_size: int,
        prefix: str,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.head_size = kv_lora_rank + qk_rope_head_dim
        self.layer_name = prefix
        self.attn_backend = backend
        self.impl = MLAImpl(
            num_heads=num_heads, head_size=self.head_size, dcp_world_size=dcp_world_size
        )
        self.kv_b_proj = _meta_linear(kv_lora_rank, num_heads * 256)

    def get_attn_backend(self) -> type[AttentionBackend]:
        return self.attn_backend


class DeepseekV4Attention(nn.Module):
    """DeepSeek-V4 attention: `n_local_heads` per TP rank, one 512-wide head for q and output.

    vLLM's class is abstract: each platform subclass sets the `backend_cls` class attribute, which
    `get_attn_backend()` returns (there is no `attn_backend` attribute).
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
        self.n_local_heads = n_heads // tp_size
        self.head_dim = head_dim
        self.prefix = prefix
        self.backend_cls = backend
        self.wo_a = _meta_linear(self.n_local_heads * head_dim, 1024)

    def get_attn_backend(self) -> type[AttentionBackend]:
        return self.backend_cls


class MultiHeadLatentAttention(nn.Module):
    """Kimi-K3's native MLA adapter: an attention layer of its own, *not* an `MLAAttention`.

    `num_heads` is global, `num_local_heads` per TP rank; the DCP size sits both on the layer
    (`dcp_world_size`, from the parallel config) and on the impl.
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
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_local_heads = num_heads // tp_size
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
        self.o_proj = _meta_linear(self.num_local_heads * 128, 1024)

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
        self.num_local_heads = num_heads // tp_size
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


class MTPModule(nn.Module):
    """Multi-token-prediction (draft) head: re-references an existing attention module, so
    discovery meets the same module object under a second name."""

    def __init__(self, shared_attn: nn.Module) -> None:
        super().__init__()
        self.shared_attn = shared_attn
        self.eh_proj = _meta_linear(2048, 1024)


class StandInModel(nn.Module):
    def __init__(self, layers: list[nn.Module], mtp: nn.Module | None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.mtp = mtp
