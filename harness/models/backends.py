"""Stand-in attention backends: classes with vLLM's `get_name()` static method.

The names are what the warm code reads. `B12X_MLA` is the B12X dense-MLA decode backend that
Kimi-K3 and generic MLA layers select on sm_12x; DeepSeek-V4 selects its own B12X backend.
`B12X` alone is upstream vLLM's paged (non-MLA) b12x backend and is deliberately *not* a dense-MLA
backend: a recognizer that accepted it would warm transports nobody uses.
"""

from __future__ import annotations

from harness.errors import UsageError


class AttentionBackend:
    """Base of the stand-in backends; vLLM's backends are classes used without instances."""

    NAME = "BASE"

    @classmethod
    def get_name(cls) -> str:
        return cls.NAME


class B12XMLABackend(AttentionBackend):
    NAME = "B12X_MLA"


class B12XDeepseekV4Backend(AttentionBackend):
    NAME = "B12X_MLA_SPARSE_DSV4"


class B12XPagedBackend(AttentionBackend):
    NAME = "B12X"


class FlashMLABackend(AttentionBackend):
    NAME = "FLASHMLA"


class TritonMLABackend(AttentionBackend):
    NAME = "TRITON_MLA"


class FlashInferMLABackend(AttentionBackend):
    NAME = "FLASHINFER_MLA"


class KimiDeltaAttentionBackend(AttentionBackend):
    """Kimi linear attention (KDA) state backend: never a DCP transport user."""

    NAME = "KDA"


# CLI names -> backend class, per model family. "b12x" picks each family's B12X backend.
BACKEND_CHOICES: tuple[str, ...] = (
    "b12x",
    "b12x-paged",
    "flashmla",
    "triton-mla",
    "flashinfer-mla",
)

_FAMILY_B12X: dict[str, type[AttentionBackend]] = {
    "kimi-k3": B12XMLABackend,
    "generic-mla": B12XMLABackend,
    "deepseek-v4": B12XDeepseekV4Backend,
}
_COMMON: dict[str, type[AttentionBackend]] = {
    "b12x-paged": B12XPagedBackend,
    "flashmla": FlashMLABackend,
    "triton-mla": TritonMLABackend,
    "flashinfer-mla": FlashInferMLABackend,
}


def backend_for(family: str, name: str) -> type[AttentionBackend]:
    """The backend class a layer of `family` selects when the user asks for backend `name`."""
    if name == "b12x":
        return _FAMILY_B12X[family]
    try:
        return _COMMON[name]
    except KeyError:
        raise UsageError(
            f"unknown backend {name!r}; expected one of {', '.join(BACKEND_CHOICES)}"
        ) from None
