"""What the contrast tree's layers ask for, and how each warm-code mistake must be caught there.

The keys are arithmetic on the published head counts and the tree's documented geometry
(`harness.models.builders.build_contrasts`): Kimi-K3 96 heads x 576 -> 512 at TP16 (target)
and TP8 (draft), DeepSeek-V4 128 heads x 512 -> 512 at TP16 (a layer only the module tree
holds). Nothing here reads a layer or shares code with the recognizers or the builder.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from harness.core.signature import TransportSignature

KIMI_HEADS, KIMI_QDIM, KIMI_ODIM = 96, 576, 512
DEEPSEEK_V4_HEADS, DEEPSEEK_V4_DIM = 128, 512
TARGET_TP, DRAFT_TP, PREFIXED_TP = 16, 8, 4

Caught = Literal["registry miss", "refused", "unused"]

# How each mistake of `harness.capture.broken_warms.WARM_CODE_MISTAKES` must be caught on the
# contrast tree, and which key it must name: a key the layers use and the warm missed (the
# first the step asks for), a key the DCP group refuses, or a key warmed that nothing uses.
CAUGHT_AS: dict[str, tuple[Caught, str]] = {
    "kimi-tp-16": ("registry miss", "draft"),
    "no-dcp-gate": ("refused", "dcp1"),
    "backend-prefix": ("unused", "prefixed"),
    "kimi-dcp-from-impl": ("registry miss", "target"),
    "forward-context-dropped": ("registry miss", "draft"),
    "forward-context-only": ("registry miss", "module-only"),
    "draft-skipped": ("registry miss", "draft"),
}


def contrast_keys(
    dcp: int, *, dtype: str, max_tokens: int, device_type: str
) -> dict[str, TransportSignature]:
    """The keys the tree's layers use ("target", "draft", "module-only") and the two a mistaken
    warm would add ("dcp1": the DCP1 layer's; "prefixed": the `B12X_MLA_EXPERIMENTAL` layer's)."""

    def key(heads: int, tp: int, qdim: int, odim: int, size: int = dcp) -> TransportSignature:
        return TransportSignature(
            dtype=dtype,
            total_heads=heads // tp * size,
            query_head_dim=qdim,
            output_head_dim=odim,
            dcp_world_size=size,
            max_tokens=max_tokens,
            device_type=device_type,
        )

    return {
        "target": key(KIMI_HEADS, TARGET_TP, KIMI_QDIM, KIMI_ODIM),
        "draft": key(KIMI_HEADS, DRAFT_TP, KIMI_QDIM, KIMI_ODIM),
        "module-only": key(DEEPSEEK_V4_HEADS, TARGET_TP, DEEPSEEK_V4_DIM, DEEPSEEK_V4_DIM),
        "dcp1": key(KIMI_HEADS, TARGET_TP, KIMI_QDIM, KIMI_ODIM, size=1),
        "prefixed": key(KIMI_HEADS, PREFIXED_TP, KIMI_QDIM, KIMI_ODIM),
    }


USED = ("target", "draft", "module-only")  # the keys the tree's layers use, and only those


def describe(signatures: Iterable[TransportSignature]) -> str:
    """`[key]; [key]` for a collection of signatures, sorted (for failure messages)."""
    return "; ".join(f"[{s.describe()}]" for s in sorted(signatures)) or "none"
