"""Warm implementations whose Kimi-K3 recognizer computes one field of the signature wrong, for
`dcpqual run --warm-impl tests._support.mutant_warm:NAME`: the capture suite must catch each,
because its decode step asks for what the layers hand over, not for what a recognizer says."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch import nn

from harness.core.signature import TransportSignature
from harness.warm.recognizers import KIMI_K3, RECOGNIZER_SETS, Recognizer, WarmContext
from harness.warm.warmup import WarmReport, warm

Change = Callable[[TransportSignature], dict[str, Any]]


def _wrong(recognizer: Recognizer, change: Change) -> Recognizer:
    def recognize(module: nn.Module, ctx: WarmContext) -> TransportSignature | None:
        sig = recognizer.recognize(module, ctx)
        return None if sig is None else dataclasses.replace(sig, **change(sig))

    return dataclasses.replace(recognizer, recognize=recognize)


def _with_kimi(change: Change) -> tuple[Recognizer, ...]:
    return tuple(_wrong(r, change) if r is KIMI_K3 else r for r in RECOGNIZER_SETS["vendored"])


def warm_kimi_wrong_capacity(model: nn.Module, **kwargs: Any) -> WarmReport:
    """Kimi-K3 transports sized for twice the tokens the layers' managers are built for."""
    return warm(model, recognizers=_with_kimi(lambda s: {"max_tokens": 2 * s.max_tokens}), **kwargs)


def warm_kimi_wrong_output_dtype(model: nn.Module, **kwargs: Any) -> WarmReport:
    """Kimi-K3 transports reducing fp16 outputs where the layers reduce bf16."""
    return warm(model, recognizers=_with_kimi(lambda s: {"dtype": "fp16"}), **kwargs)
