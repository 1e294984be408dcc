"""The names the CLI offers for stand-in trees, torch-free so that `--help` needs no torch.

The modules that build from these names (`harness.models`, `harness.warm.recognizers`) import
torch; a test holds their tables to these tuples.
"""

from __future__ import annotations

__all__ = [
    "ATTENTION_BACKENDS",
    "FAMILY_HEADS",
    "KV_CACHE_DTYPES",
    "MODEL_CHOICES",
    "MODEL_FAMILIES",
    "RECOGNIZER_SET_NAMES",
    "VLLM_ATTENTION_BACKENDS",
    "VLLM_WARM_IMPL",
    "WARM_IMPL_NAMES",
]

# vLLM's names of the attention backends (`VLLM_ATTENTION_BACKEND`, AttentionBackendEnum and
# the fork's B12X MLA backends) -> the stand-in's name. The three B12X MLA names are each
# family's B12X backend ("b12x"); vLLM 0.32's own `B12X` is the paged one.
VLLM_ATTENTION_BACKENDS: dict[str, str] = {
    "B12X_MLA": "b12x",
    "B12X_MLA_SPARSE": "b12x",
    "V4_B12X_SPARSE": "b12x",
    "B12X": "b12x-paged",
    "FLASHMLA": "flashmla",
    "TRITON_MLA": "triton-mla",
    "FLASHINFER_MLA": "flashinfer-mla",
}
# Stand-in model families with published head geometry; "mixed" combines them in one tree.
MODEL_FAMILIES: tuple[str, ...] = ("kimi-k3", "deepseek-v4", "generic-mla")
MODEL_CHOICES: tuple[str, ...] = (*MODEL_FAMILIES, "mixed")
# Attention heads of each family (before the TP split): what `dcpqual run` checks --tp against
# before it starts torchrun, without importing the builders.
FAMILY_HEADS: dict[str, int] = {"kimi-k3": 96, "deepseek-v4": 128, "generic-mla": 128}
# CLI names of attention backends; "b12x" picks each family's B12X backend.
ATTENTION_BACKENDS: tuple[str, ...] = (
    "b12x",
    "b12x-paged",
    "flashmla",
    "triton-mla",
    "flashinfer-mla",
)
# kv_cache_dtype values the stand-ins accept (vLLM's CacheConfig.cache_dtype spellings).
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla")
# Recognizer sets of the warm code: after the Kimi-K3 fix, and from before it.
RECOGNIZER_SET_NAMES: tuple[str, ...] = ("vendored", "before-kimi")
# Built-in warm implementations (`--warm-impl`); other names (vllm, package.module:function)
# are resolved by importing what they name.
WARM_IMPL_NAMES: tuple[str, ...] = ("vendored", "before-kimi")
# Production's own warm function (the B12X fork's kernel_warmup), on vLLM's real trees: the one
# warm code the evidence does not call a copy.
VLLM_WARM_IMPL = "vllm"
