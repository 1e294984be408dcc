"""A transport registry that only records which keys a warm asks for (no collectives), for
tests that judge a warm by the keys it creates."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.core.signature import TransportSignature


@dataclass
class _NoopTransport:
    signature: TransportSignature

    def gather_queries(self, q_local: torch.Tensor) -> torch.Tensor:
        return q_local

    def reduce_outputs(self, partial_out: torch.Tensor, partial_lse: torch.Tensor) -> torch.Tensor:
        return partial_out


@dataclass
class KeyRecorder:
    """`created`: the keys asked for through `get_or_create`, in order, each once."""

    created: list[TransportSignature] = field(default_factory=list)

    def get_or_create(self, signature: TransportSignature, group: object = None) -> _NoopTransport:
        if signature not in self.created:
            self.created.append(signature)
        return _NoopTransport(signature)

    def get(self, signature: TransportSignature) -> _NoopTransport | None:
        return _NoopTransport(signature) if signature in self.created else None
