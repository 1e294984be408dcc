"""What warmup needs from a transport registry, so the warm code does not depend on one backend.

`harness.transport.registry.TransportRegistry` is the real implementation; tests may pass any
object with these methods.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

from harness.core.signature import TransportSignature


@runtime_checkable
class DCPTransport(Protocol):
    """One ready DCP transport: query gather and LSE-weighted output reduction."""

    signature: TransportSignature

    def gather_queries(self, q_local: torch.Tensor) -> torch.Tensor:
        """[B, h, qdim] -> [B, h * dcp, qdim], concatenated in DCP rank order."""
        ...

    def reduce_outputs(self, partial_out: torch.Tensor, partial_lse: torch.Tensor) -> torch.Tensor:
        """[B, H, odim] + fp32 [B, H] -> this rank's combined heads [B, H / dcp, odim]."""
        ...


@runtime_checkable
class TransportRegistryLike(Protocol):
    """Creates (collectively) and looks up transports by signature."""

    def get_or_create(
        self, signature: TransportSignature, group: dist.ProcessGroup | None = None
    ) -> DCPTransport: ...

    def get(self, signature: TransportSignature) -> DCPTransport | None: ...
