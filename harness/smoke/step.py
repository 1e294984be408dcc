"""The stand-in Kimi-K3 decode step at world 1, and how warmup's signatures reach it.

One process cannot host the DCP16 group that Kimi-K3 TP16/DCP16 warms for, so the smoke keeps
everything it can from the production path and says where it differs:

- The model is the stand-in Kimi-K3 built at TP16/DCP16 (MLA layers plus the MTP head's
  re-reference), and the vendored warm code runs on it unchanged: its discovery finds the
  production signature (96 heads x 576 -> 512, dcp=16).
- `World1Registry` is the registry warmup sees: it creates each signature it is asked for as its
  world-1 projection (same dtype, heads, head dims and capacity; a DCP group of one rank), so
  the transports exist on the one-rank NCCL group before capture.
- `SmokeStep` runs each attention registration of the model the way a rank whose DCP group is
  the whole world would: it hands the transport the gathered query `[B, heads, qdim]` (heads =
  the layer's local heads x its DCP size, read from the layer, not from the recognizers), keys
  the transport by that tensor, gathers (a world-1 NCCL all-gather), attends to its KV cache and
  reduces (world-1 all-gather and reduce-scatter). A recognizer that computes another signature
  leaves the step without a warmed transport, which the strict capture reports.

`reference(seed)` is an independent oracle: fp32 scaled-dot-product attention on the CPU over the
same generated queries and latent cache (`torch.nn.functional.scaled_dot_product_attention`, not
the step's code).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness.capture.decode import (
    TransportUser,
    partial_attention,
    seeded_generator,
    transport_layers,
)
from harness.core.signature import TransportSignature
from harness.errors import UsageError
from harness.models.builders import BuiltModel
from harness.transport.dtypes import DTYPES, dtype_name
from harness.warm.protocols import DCPTransport, TransportRegistryLike

PRODUCTION_TP = 16
PRODUCTION_DCP = 16
# Kimi-K3 puts MLA on every fourth layer: 8 layers give two MLA layers and the MTP re-reference.
NUM_LAYERS = 8
DTYPE = "bf16"
MAX_TOKENS = 8


def world1(signature: TransportSignature) -> TransportSignature:
    """The transport a one-rank DCP group needs for `signature`: everything kept but the group."""
    return dataclasses.replace(signature, dcp_world_size=1)


class World1Registry:
    """The registry the warm code sees at world 1: every signature it asks for is created (and
    looked up) as its world-1 projection in the real registry underneath.

    `asked` keeps the signatures as warmup named them, in order, for the evidence.
    """

    def __init__(self, registry: TransportRegistryLike) -> None:
        self.registry = registry
        self.asked: list[TransportSignature] = []

    def get_or_create(
        self, signature: TransportSignature, group: dist.ProcessGroup | None = None
    ) -> DCPTransport:
        self.asked.append(signature)
        return self.registry.get_or_create(world1(signature), group)

    def get(self, signature: TransportSignature) -> DCPTransport | None:
        return self.registry.get(world1(signature))


@dataclass(frozen=True)
class SmokeLayer:
    """One attention registration of the model, as the world-1 step drives it."""

    name: str
    heads: int  # the gathered heads: the layer's local heads x its DCP size
    query_head_dim: int
    output_head_dim: int


def smoke_layers(built: BuiltModel) -> tuple[SmokeLayer, ...]:
    """Every registration (MTP re-reference included) whose layer uses a DCP transport."""
    layers = [
        SmokeLayer(name, m.num_heads * built.spec.dcp, m.query_head_dim, m.output_head_dim)
        for name, _, m in transport_layers(built)
    ]
    if not layers:
        raise UsageError(f"no attention layer of {built.spec.model} uses a DCP transport")
    return tuple(layers)


class SmokeStep(TransportUser):
    """`step(inputs)`: one gathered query per registration in, one reduced output per
    registration out; see the module doc. `used_signatures` lists the transports asked for."""

    def __init__(
        self,
        layers: tuple[SmokeLayer, ...],
        *,
        registry: TransportRegistryLike,
        device: torch.device,
        dtype: str = DTYPE,
        max_tokens: int = MAX_TOKENS,
        batch: int = 2,
        kv_tokens: int = 16,
        seed: int = 0,
    ) -> None:
        if not 1 <= batch <= max_tokens:
            raise UsageError(f"batch must be in [1, max_tokens={max_tokens}], got {batch}")
        if kv_tokens < 1:
            raise UsageError(f"kv_tokens must be at least 1, got {kv_tokens}")
        super().__init__(registry, None)
        self.layers = layers
        self.device = device
        self.dtype = DTYPES[dtype_name(dtype)]
        self.max_tokens = max_tokens
        self.batch = batch
        self.seed = seed
        self.kv_tokens = kv_tokens
        # Unequal cache lengths per layer, so a step that mixed up layers would show it.
        self.kv = tuple(self._kv(i, kv_tokens + i).to(device) for i in range(len(layers)))

    def _one_rank(
        self, dtype: torch.dtype, heads: int, qdim: int, odim: int, device_type: str
    ) -> TransportSignature:
        return TransportSignature(
            dtype=dtype_name(dtype),
            total_heads=heads,
            query_head_dim=qdim,
            output_head_dim=odim,
            dcp_world_size=1,
            max_tokens=self.max_tokens,
            device_type=device_type,
        )

    def signature_for(self, query: torch.Tensor, output_head_dim: int) -> TransportSignature:
        """The transport a layer needs, keyed by the tensor it hands over, on a one-rank group."""
        _, heads, qdim = query.shape
        return self._one_rank(query.dtype, heads, qdim, output_head_dim, query.device.type)

    def expected_signatures(self) -> tuple[TransportSignature, ...]:
        found = {
            self._one_rank(
                self.dtype,
                layer.heads,
                layer.query_head_dim,
                layer.output_head_dim,
                self.device.type,
            )
            for layer in self.layers
        }
        return tuple(sorted(found))

    def _query(self, seed: int, layer: int) -> torch.Tensor:
        spec = self.layers[layer]
        shape = (self.batch, spec.heads, spec.query_head_dim)
        return torch.randn(shape, generator=seeded_generator(1, seed, layer)).to(self.dtype)

    def _kv(self, layer: int, tokens: int) -> torch.Tensor:
        width = self.layers[layer].query_head_dim
        values = torch.randn((tokens, width), generator=seeded_generator(2, self.seed, layer))
        return values.to(self.dtype)

    def make_inputs(self, seed: int) -> tuple[torch.Tensor, ...]:
        return tuple(self._query(seed, i).to(self.device) for i in range(len(self.layers)))

    def __call__(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if len(inputs) != len(self.layers):
            raise UsageError(f"the step takes {len(self.layers)} query tensors, got {len(inputs)}")
        outputs = []
        for layer, query, kv in zip(self.layers, inputs, self.kv, strict=True):
            transport = self._transport(self.signature_for(query, layer.output_head_dim))
            gathered = transport.gather_queries(query)
            partial, lse = partial_attention(gathered, kv, layer.output_head_dim)
            outputs.append(transport.reduce_outputs(partial.to(query.dtype), lse))
        return tuple(outputs)

    def reference(self, seed: int) -> tuple[torch.Tensor, ...]:
        """Whole-context attention of `make_inputs(seed)`, fp32 on the CPU (see the module doc)."""
        results = []
        for i, layer in enumerate(self.layers):
            q = self._query(seed, i).to(torch.float32).unsqueeze(2)  # [B, H, 1, qdim]
            kv = self._kv(i, self.kv_tokens + i).to(torch.float32)  # regenerated, not the step's
            keys = kv.expand(q.shape[0], q.shape[1], *kv.shape)  # one latent head for all (MQA)
            values = keys[..., : layer.output_head_dim]
            out = F.scaled_dot_product_attention(
                q, keys, values, scale=1.0 / math.sqrt(layer.query_head_dim)
            )
            results.append(out.squeeze(2))
        return tuple(results)
