"""Single stand-in attention layers, built directly rather than through a model builder, for
tests that change one attribute of one layer and watch what the warm code makes of it."""

from __future__ import annotations

from harness.models.backends import AttentionBackend, B12XMLABackend, B12XMLASparseBackend
from harness.models.layers import EngineSettings, MLAAttention, MultiHeadLatentAttention

# MLA's latent shape: a 576-wide query head (512 + 64) gathered, the 512-wide latent reduced.
MLA_DIMS = {"kv_lora_rank": 512, "qk_rope_head_dim": 64}


def kimi_layer(
    *, backend: type[AttentionBackend] = B12XMLABackend, dcp: int = 16
) -> MultiHeadLatentAttention:
    """Kimi-K3's MLA adapter at TP16 (96 heads, 6 local); its only child is `o_proj`."""
    return MultiHeadLatentAttention(
        num_heads=96, tp_size=16, backend=backend, dcp_world_size=dcp, **MLA_DIMS,
        prefix="model.layers.3.self_attn",
    )  # fmt: skip


def generic_layer(*, num_heads: int = 16, dcp: int = 8) -> MLAAttention:
    """A generic MLA layer (`num_heads` local) on the sparse B12X backend over a2a: inside the
    fork's `dcp_b12x` gate at DCP 2, 4 or 8."""
    return MLAAttention(
        num_heads=num_heads, backend=B12XMLASparseBackend, dcp_world_size=dcp, **MLA_DIMS,
        prefix="model.layers.0.self_attn.attn", engine=EngineSettings(dcp_comm_backend="a2a"),
    )  # fmt: skip
