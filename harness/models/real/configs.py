"""Tiny `config.json` files for vLLM's real model classes, written by the harness itself.

No weights and no hub: vLLM reads only the config and initializes parameters at random. The
attention geometry is the published one (Kimi-K3: 96 heads, latent 512 + rope 64 = 576-wide
query head, 512-wide output head); everything else (hidden size, vocabulary, layers, MLP) is
shrunk so a tree builds in seconds. KDA (linear attention) layers and MoE are left out: they
carry no DCP transport, and KDA's mamba-style cache config does not build on CPU. DeepSeek-V3
keeps its published MLA geometry (128 heads, 512 + 64 -> 512) with dense MLPs only
(`first_k_dense_replace` covers every layer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KIMI_HEADS = 96
DEEPSEEK_V3_HEADS = 128
KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
MAX_MODEL_LEN = 256


@dataclass(frozen=True)
class TinyConfig:
    """One model's tiny config: its vLLM architecture and the config.json body."""

    model: str
    architecture: str
    body: dict[str, Any]
    # vLLM's class for the speculative draft built next to the target (None: no draft).
    draft: str | None = None

    def write(self, folder: Path) -> Path:
        """Write `folder/config.json` (the folder must be new or empty); returns the folder."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.body, indent=2, sort_keys=True))
        return folder


def kimi_k3(*, mla_layers: int = 2, mtp_layers: int = 1) -> TinyConfig:
    """Kimi-K3's text tree (`KimiLinearForCausalLM`) with `mtp_layers` MTP draft layers."""
    body = {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "torch_dtype": "bfloat16",
        "vocab_size": 256,
        "hidden_size": 256,
        "intermediate_size": 256,
        "num_hidden_layers": mla_layers,
        "num_attention_heads": KIMI_HEADS,
        "num_key_value_heads": KIMI_HEADS,
        "q_lora_rank": None,
        "kv_lora_rank": KV_LORA_RANK,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": QK_ROPE_HEAD_DIM,
        "v_head_dim": 32,
        "mla_use_nope": True,
        "num_nextn_predict_layers": mtp_layers,
        "max_position_embeddings": MAX_MODEL_LEN,
        "linear_attn_config": {
            "kda_layers": [],
            "full_attn_layers": list(range(1, mla_layers + 1)),
        },
    }
    return TinyConfig(
        "kimi-k3", "KimiLinearForCausalLM", body, draft="vllm.models.kimi_k3:KimiK3MTP"
    )


def deepseek_v3(*, mla_layers: int = 2) -> TinyConfig:
    """DeepSeek-V3 (`DeepseekV3ForCausalLM`): vLLM's generic `MLAAttention`, no MoE layer."""
    body = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "torch_dtype": "bfloat16",
        "vocab_size": 256,
        "hidden_size": 256,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "num_hidden_layers": mla_layers,
        "first_k_dense_replace": mla_layers,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_layer_freq": 1,
        "num_attention_heads": DEEPSEEK_V3_HEADS,
        "num_key_value_heads": DEEPSEEK_V3_HEADS,
        "q_lora_rank": None,
        "kv_lora_rank": KV_LORA_RANK,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": QK_ROPE_HEAD_DIM,
        "v_head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000,
        "max_position_embeddings": MAX_MODEL_LEN,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    return TinyConfig("deepseek-v3", "DeepseekV3ForCausalLM", body)


TINY_CONFIGS = {"kimi-k3": kimi_k3, "deepseek-v3": deepseek_v3}
REAL_MODEL_CHOICES: tuple[str, ...] = tuple(TINY_CONFIGS)
