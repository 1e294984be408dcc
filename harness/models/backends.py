"""Stand-in attention backends: classes with vLLM's `get_name()` static method.

The names are what the warm code reads, as the fork spells them:
`B12X_MLA` is the B12X dense-MLA decode backend Kimi-K3 selects on sm_12x; generic
`MLAAttention` layers use the B12X DCP transport through `B12X_MLA_SPARSE` (and only behind the
layer's `dcp_b12x` gate); DeepSeek-V4's B12X layer selects `V4_B12X_SPARSE`.
`B12X` alone is upstream vLLM's paged (non-MLA) b12x backend and is deliberately *not* a dense-MLA
backend: a recognizer that accepted it would warm transports nobody uses.
"""

from __future__ import annotations

from harness.core.choices import ATTENTION_BACKENDS
from harness.errors import UsageError


class AttentionBackend:
    """Base of the stand-in backends; vLLM's backends are classes used without instances."""

    NAME = "BASE"

    @classmethod
    def get_name(cls) -> str:
        return cls.NAME


class B12XMLABackend(AttentionBackend):
    NAME = "B12X_MLA"


class B12XMLAExperimentalBackend(AttentionBackend):
    """A made-up backend whose name starts with `B12X_MLA` and is not it: a recognizer that
    matched backend names by prefix would take its layers for B12X_MLA ones."""

    NAME = "B12X_MLA_EXPERIMENTAL"


class B12XMLASparseBackend(AttentionBackend):
    NAME = "B12X_MLA_SPARSE"


class B12XDeepseekV4Backend(AttentionBackend):
    NAME = "V4_B12X_SPARSE"


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
BACKEND_CHOICES: tuple[str, ...] = ATTENTION_BACKENDS

_FAMILY_B12X: dict[str, type[AttentionBackend]] = {
    "kimi-k3": B12XMLABackend,
    "generic-mla": B12XMLASparseBackend,
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
