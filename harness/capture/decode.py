"""A decode step that goes through every attention layer's DCP transport, the way vLLM's DCP
manager drives it: per layer, key the transport by the shapes of the tensors it is handed, look
it up in the registry, and on a miss create it. That creation on first use is the lazy work the
seed change removed for Kimi-K3; inside a capture window it is exactly what the detectors catch.

The per-layer runtime geometry is read here from the layer's own attributes, independently of
the warm code's recognizers, so a recognizer that computes the wrong signature cannot make the
step agree with it: the step asks for what the layer really needs.

One DCP decode step per layer (domain.md section 1): gather the local queries `[B, h, qdim]`
over the DCP group, attend all gathered heads to this rank's KV shard (MQA over the latent cache;
the values are the first `odim` latent elements), reduce the partial outputs with their LSEs.
Queries and KV shards are generated from seeds per (layer, DCP rank), so every rank can also
compute the whole-context reference of its own heads without communicating (`reference`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from harness.errors import GeometryError, UsageError
from harness.models import BuiltModel
from harness.models.layers import DeepseekV4Attention, MLAAttention, MultiHeadLatentAttention
from harness.warm.protocols import TransportRegistryLike
from harness.warm.recognizers import WarmContext, backend_name
from harness.warm.signature import DTYPES, TransportSignature, dtype_name

# Backends whose decode runs through the B12X DCP transport (see harness.models.backends).
TRANSPORT_BACKENDS = frozenset({"B12X_MLA", "B12X_MLA_SPARSE_DSV4"})


@dataclass(frozen=True)
class LayerGeometry:
    """What one attention layer hands the transport at runtime, per rank."""

    local_heads: int
    query_head_dim: int
    output_head_dim: int
    dcp_world_size: int | None  # what the layer says, None where it does not carry it


def runtime_geometry(module: nn.Module) -> LayerGeometry | None:
    """The transport geometry a layer uses at runtime, or None if it uses no DCP transport."""
    if backend_name(module) not in TRANSPORT_BACKENDS:
        return None
    if isinstance(module, MultiHeadLatentAttention):
        geometry = LayerGeometry(
            module.num_local_heads, module.head_size, module.kv_lora_rank, module.dcp_world_size
        )
    elif isinstance(module, MLAAttention):
        geometry = LayerGeometry(
            module.num_heads, module.head_size, module.kv_lora_rank, module.impl.dcp_world_size
        )
    elif isinstance(module, DeepseekV4Attention):
        geometry = LayerGeometry(module.n_local_heads, module.head_dim, module.head_dim, None)
    else:
        return None
    if geometry.dcp_world_size is not None and geometry.dcp_world_size <= 1:
        return None  # DCP1: no transport
    return geometry


@dataclass(frozen=True)
class DecodeLayer:
    """One registration of an attention layer in the step (the MTP head's is one more)."""

    name: str
    module: nn.Module
    geometry: LayerGeometry


def partial_attention(
    queries: torch.Tensor, kv: torch.Tensor, output_head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of `[B, H, qdim]` queries to a `[T, qdim]` latent shard, in fp32.

    Returns the partial output `[B, H, odim]` and its natural-log LSE `[B, H]`.
    """
    q = queries.to(torch.float32)
    k = kv.to(torch.float32)
    scores = torch.einsum("bhd,td->bht", q, k) * (1.0 / math.sqrt(q.shape[-1]))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bht,td->bhd", probs, k[:, :output_head_dim])
    return out, lse


def _generator(*parts: int) -> torch.Generator:
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + part) % (2**63 - 1)
    return torch.Generator().manual_seed(seed)


class DecodeStep:
    """A callable decode step over a built model's attention layers (see the module doc).

    `step(inputs)` takes one query tensor per layer registration (`make_inputs(seed)`) and
    returns one reduced output `[B, h, odim]` per registration. `used_signatures` lists the
    transports the step asked for since the last `reset_used()`.
    """

    def __init__(
        self,
        built: BuiltModel,
        *,
        registry: TransportRegistryLike,
        context: WarmContext,
        group: dist.ProcessGroup | None = None,
        batch: int = 2,
        kv_tokens: int = 3,
        seed: int = 0,
    ) -> None:
        if not 1 <= batch <= context.max_tokens:
            raise UsageError(f"batch must be in [1, max_tokens={context.max_tokens}], got {batch}")
        self.model_name = built.spec.model
        self.registry = registry
        self.group = group
        self.context = context
        self.batch = batch
        self.kv_tokens = kv_tokens
        self.seed = seed
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.device = torch.device(getattr(registry, "device", "cpu"))
        self.dtype = DTYPES[context.dtype]
        self.layers = self._layers(built)
        self.kv = tuple(self._kv(i, self.rank).to(self.device) for i in range(len(self.layers)))
        self._used: set[TransportSignature] = set()

    def _layers(self, built: BuiltModel) -> tuple[DecodeLayer, ...]:
        layers = []
        for name, module in built.static_forward_context.items():
            geometry = runtime_geometry(module)
            if geometry is None:
                continue
            if geometry.dcp_world_size not in (None, self.world):
                raise GeometryError(
                    f"layer {name} was built for dcp={geometry.dcp_world_size}, the step runs on "
                    f"a DCP group of {self.world} ranks"
                )
            layers.append(DecodeLayer(name, module, geometry))
        if not layers:
            raise UsageError(
                f"no attention layer of {built.spec.model} uses a B12X DCP transport at "
                f"tp={built.spec.tp}, dcp={built.spec.dcp}, backend={built.spec.backend}"
            )
        return tuple(layers)

    # -- signatures -------------------------------------------------------------------------

    def _signature(
        self, local_heads: int, qdim: int, odim: int, dtype: torch.dtype, device_type: str
    ) -> TransportSignature:
        return TransportSignature(
            dtype=dtype_name(dtype),
            total_heads=local_heads * self.world,
            query_head_dim=qdim,
            output_head_dim=odim,
            dcp_world_size=self.world,
            max_tokens=self.context.max_tokens,
            device_type=device_type,
        )

    def signature_for(self, query: torch.Tensor, output_head_dim: int) -> TransportSignature:
        """The transport a layer needs, keyed by the tensor it hands over (as vLLM does)."""
        _, heads, qdim = query.shape
        return self._signature(heads, qdim, output_head_dim, query.dtype, query.device.type)

    def expected_signatures(self) -> tuple[TransportSignature, ...]:
        """The distinct signatures one step will ask for, sorted."""
        found = {
            self._signature(
                layer.geometry.local_heads,
                layer.geometry.query_head_dim,
                layer.geometry.output_head_dim,
                self.dtype,
                self.device.type,
            )
            for layer in self.layers
        }
        return tuple(sorted(found))

    @property
    def used_signatures(self) -> tuple[TransportSignature, ...]:
        return tuple(sorted(self._used))

    def reset_used(self) -> None:
        self._used.clear()

    # -- data -------------------------------------------------------------------------------

    def _query(self, seed: int, layer: int, rank: int) -> torch.Tensor:
        geometry = self.layers[layer].geometry
        shape = (self.batch, geometry.local_heads, geometry.query_head_dim)
        values = torch.randn(shape, generator=_generator(1, seed, layer, rank))
        return values.to(self.dtype)

    def _kv(self, layer: int, rank: int) -> torch.Tensor:
        tokens = self.kv_tokens + rank % 3  # unequal shards, so the LSE weights differ
        width = self.layers[layer].geometry.query_head_dim
        values = torch.randn((tokens, width), generator=_generator(2, self.seed, layer, rank))
        return values.to(self.dtype)

    def make_inputs(self, seed: int) -> tuple[torch.Tensor, ...]:
        """This rank's queries for one step, one per layer registration, on the device."""
        return tuple(
            self._query(seed, i, self.rank).to(self.device) for i in range(len(self.layers))
        )

    # -- the step and its oracle ------------------------------------------------------------

    def __call__(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if len(inputs) != len(self.layers):
            raise UsageError(f"the step takes {len(self.layers)} query tensors, got {len(inputs)}")
        outputs = []
        for layer, query, kv in zip(self.layers, inputs, self.kv, strict=True):
            signature = self.signature_for(query, layer.geometry.output_head_dim)
            self._used.add(signature)
            transport = self.registry.get(signature)
            if transport is None:
                # vLLM's DCP manager on a miss: create the transport on first use. Collective
                # and allocating: the lazy work that warmup exists to move before capture.
                transport = self.registry.get_or_create(signature, self.group)
            gathered = transport.gather_queries(query)
            partial, lse = partial_attention(gathered, kv, layer.geometry.output_head_dim)
            outputs.append(transport.reduce_outputs(partial.to(query.dtype), lse))
        return tuple(outputs)

    def reference(self, seed: int) -> tuple[torch.Tensor, ...]:
        """This rank's heads of whole-context attention, fp32 on CPU, for `make_inputs(seed)`."""
        results = []
        for i, layer in enumerate(self.layers):
            queries = torch.cat([self._query(seed, i, r) for r in range(self.world)], dim=1)
            kv = torch.cat([self._kv(i, r) for r in range(self.world)], dim=0)
            out, _ = partial_attention(queries, kv, layer.geometry.output_head_dim)
            h = layer.geometry.local_heads
            results.append(out[:, self.rank * h : (self.rank + 1) * h])
        return tuple(results)
