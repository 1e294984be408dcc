"""A decode step that goes through every attention layer's DCP transport, the way vLLM's DCP
manager drives it: per layer, key the transport by what the layer hands over, look it up in the
registry, and on a miss create it. That creation on first use is the lazy work the seed change
removed for Kimi-K3; inside a capture window it is exactly what the detectors catch.

What a layer asks for comes from the layer's own decode forward (`forward_decode`): the step
binds itself to each layer's DCP manager (built by the layer at construction, as vLLM's
`MLADCPManager` is) and keys the transport on the tensors the layer passes to `query_gather` and
`combine` (their heads, head dims and dtypes) and on the manager's capacity and comm backend. It
reads nothing the warm code's recognizers read and shares no code with them, so a recognizer
that computes the wrong signature cannot make the step agree with it.

One DCP decode step per layer: gather the local queries `[B, h, qdim]`
over the DCP group, attend all gathered heads to this rank's KV shard (MQA over the latent cache;
the values are the first `odim` latent elements), reduce the partial outputs with their LSEs.
Queries and KV shards are generated from seeds per (layer, DCP rank), so every rank can also
compute the whole-context reference of its own heads without communicating (`reference`).

Padded heads (a TP that does not divide the heads: 96 at TP9 is 11 per rank, 99 in all): the
tail heads past the layer's `original_num_attention_heads` are padding, as in the fork. Their
queries are zero (the zero-padded projection's rows) and their reduced outputs are masked to
zero (the output projection drops them), in the step and in its reference alike; the transports
still move every row, padding included, as the fork's do.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from harness.core.signature import TransportSignature
from harness.errors import GeometryError, UsageError
from harness.models.builders import BuiltModel
from harness.models.dcp import DCPManager
from harness.models.layers import DCPLayer
from harness.transport.dtypes import dtype_name
from harness.warm.protocols import DCPTransport, TransportRegistryLike


def transport_manager(module: nn.Module) -> DCPManager | None:
    """The layer's DCP manager if its decode runs through the B12X DCP transport, else None."""
    manager = getattr(module, "dcp_manager", None)
    if isinstance(manager, DCPManager) and manager.b12x:
        return manager
    return None


def transport_layers(built: BuiltModel) -> Iterator[tuple[str, nn.Module, DCPManager]]:
    """(name, layer, manager) of every forward-context registration (the draft's included)
    whose decode runs through the B12X DCP transport, in registration order, then of every
    such layer of the model tree that no registration holds (a layer the forward context
    misses still runs in the model's forward)."""
    registered: set[int] = set()
    for name, module in built.static_forward_context.items():
        registered.add(id(module))
        manager = transport_manager(module)
        if manager is not None:
            yield name, module, manager
    for name, module in built.model.named_modules():
        manager = transport_manager(module)
        if manager is not None and id(module) not in registered:
            yield name, module, manager


@dataclass(frozen=True)
class DecodeLayer:
    """One registration of an attention layer in the step (the draft's is one more);
    `padding` marks this rank's local heads that are tail padding (None: none are)."""

    name: str
    module: DCPLayer
    manager: DCPManager
    padding: torch.Tensor | None = None


def padding_mask(module: nn.Module, local_heads: int, tp: int, tp_rank: int) -> torch.Tensor | None:
    """This TP rank's padded local heads of a layer (True = padding), from the layer's
    `original_num_attention_heads`; None where the layer has no padding here."""
    original = getattr(module, "original_num_attention_heads", None)
    if not isinstance(original, int):
        return None
    real = max(0, min(local_heads, original - tp_rank * local_heads))
    if real == local_heads:
        return None
    return torch.arange(local_heads) >= real


def _masked(values: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:
    """`values` [B, heads, dim] with the padded heads' rows zero."""
    if padding is None:
        return values
    return values.masked_fill(padding.to(values.device)[None, :, None], 0)


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


def seeded_generator(*parts: int) -> torch.Generator:
    """A CPU generator seeded from `parts` (what, seed, layer, rank), so any rank can regenerate
    any rank's data."""
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + part) % (2**63 - 1)
    return torch.Generator().manual_seed(seed)


class TransportUser:
    """How a decode step reaches its transports, as vLLM's DCP manager does: look the signature
    up on every call and, on a miss, create it on first use (collective and allocating: the lazy
    work that warmup exists to move before capture). `used_signatures` lists the signatures asked
    for since the last `reset_used()`."""

    def __init__(self, registry: TransportRegistryLike, group: dist.ProcessGroup | None) -> None:
        self.registry = registry
        self.group = group
        self._used: set[TransportSignature] = set()

    def _transport(self, signature: TransportSignature) -> DCPTransport:
        self._used.add(signature)
        transport = self.registry.get(signature)
        if transport is None:
            transport = self.registry.get_or_create(signature, self.group)
        return transport

    @property
    def used_signatures(self) -> tuple[TransportSignature, ...]:
        return tuple(sorted(self._used))

    def reset_used(self) -> None:
        self._used.clear()


class DecodeStep(TransportUser):
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
        group: dist.ProcessGroup | None = None,
        batch: int = 2,
        kv_tokens: int = 3,
        seed: int = 0,
    ) -> None:
        super().__init__(registry, group)
        self.model_name = built.spec.model
        self.batch = batch
        self.kv_tokens = kv_tokens
        self.seed = seed
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.tp = built.spec.tp
        self.tp_rank = dist.get_rank() % self.tp  # TP groups are consecutive global ranks
        self.device = torch.device(getattr(registry, "device", "cpu"))
        self.layers = self._layers(built)
        capacity = min(layer.manager.max_num_tokens for layer in self.layers)
        if not 1 <= batch <= capacity:
            raise UsageError(
                f"batch must be in [1, {capacity}] (the layers' capacity), got {batch}"
            )
        self.kv = tuple(self._kv(i, self.rank).to(self.device) for i in range(len(self.layers)))
        for layer in self.layers:
            layer.manager.hook = self

    def _layers(self, built: BuiltModel) -> tuple[DecodeLayer, ...]:
        layers = []
        for name, module, manager in transport_layers(built):
            assert isinstance(module, DCPLayer), f"{name}: a DCP manager on a non-DCP layer"
            dcp = getattr(module, "dcp_world_size", None)
            if isinstance(dcp, int) and dcp != self.world:
                raise GeometryError(
                    f"layer {name} was built for dcp={dcp}, the step runs on a DCP group of "
                    f"{self.world} ranks"
                )
            mask = padding_mask(module, manager.num_heads, self.tp, self.tp_rank)
            layers.append(DecodeLayer(name, module, manager, mask))
        if not layers:
            raise UsageError(
                f"no attention layer of {built.spec.model} uses a B12X DCP transport at "
                f"tp={built.spec.tp}, dcp={built.spec.dcp}, backend={built.spec.backend}"
            )
        return tuple(layers)

    # -- what a layer asks for --------------------------------------------------------------

    def _key(
        self,
        manager: DCPManager,
        *,
        local_heads: int,
        query_head_dim: int,
        query_dtype: torch.dtype,
        output_head_dim: int,
        output_dtype: torch.dtype,
        device_type: str,
    ) -> TransportSignature:
        return TransportSignature(
            dtype=dtype_name(output_dtype),
            query_dtype=dtype_name(query_dtype),
            total_heads=local_heads * self.world,
            query_head_dim=query_head_dim,
            output_head_dim=output_head_dim,
            dcp_world_size=self.world,
            max_tokens=manager.max_num_tokens,
            device_type=device_type,
            comm_backend=manager.comm_backend,
        )

    def _gather_key(self, manager: DCPManager, query: torch.Tensor) -> TransportSignature:
        """The gather is keyed by the query it is handed (as vLLM's manager call is)."""
        _, heads, qdim = query.shape
        return self._key(
            manager,
            local_heads=heads,
            query_head_dim=qdim,
            query_dtype=query.dtype,
            output_head_dim=manager.output_head_dim,
            output_dtype=manager.output_dtype,
            device_type=query.device.type,
        )

    def _combine_key(self, manager: DCPManager, partial: torch.Tensor) -> TransportSignature:
        """The reduction is keyed by the partial output it is handed."""
        _, heads, odim = partial.shape
        return self._key(
            manager,
            local_heads=heads // self.world,
            query_head_dim=manager.query_head_dim,
            query_dtype=manager.query_dtype,
            output_head_dim=odim,
            output_dtype=partial.dtype,
            device_type=partial.device.type,
        )

    # The DCPTransportHook the layers' managers call.
    def query_gather(self, manager: DCPManager, query: torch.Tensor) -> torch.Tensor:
        return self._transport(self._gather_key(manager, query)).gather_queries(query)

    def combine(
        self, manager: DCPManager, partial_output: torch.Tensor, partial_lse: torch.Tensor
    ) -> torch.Tensor:
        transport = self._transport(self._combine_key(manager, partial_output))
        return transport.reduce_outputs(partial_output, partial_lse)

    def expected_signatures(self) -> tuple[TransportSignature, ...]:
        """The distinct signatures one step will ask for, sorted, from the layers' managers."""
        found = {
            self._key(
                layer.manager,
                local_heads=layer.manager.num_heads,
                query_head_dim=layer.manager.query_head_dim,
                query_dtype=layer.manager.query_dtype,
                output_head_dim=layer.manager.output_head_dim,
                output_dtype=layer.manager.output_dtype,
                device_type=self.device.type,
            )
            for layer in self.layers
        }
        return tuple(sorted(found))

    # -- data -------------------------------------------------------------------------------

    def _query(self, seed: int, layer: int, rank: int) -> torch.Tensor:
        manager = self.layers[layer].manager
        shape = (self.batch, manager.num_heads, manager.query_head_dim)
        values = torch.randn(shape, generator=seeded_generator(1, seed, layer, rank))
        values = _masked(values, self.layers[layer].padding)
        return values.to(manager.output_dtype)  # the layer casts to its query dtype itself

    def _kv(self, layer: int, rank: int) -> torch.Tensor:
        manager = self.layers[layer].manager
        tokens = self.kv_tokens + rank % 3  # unequal shards, so the LSE weights differ
        values = torch.randn(
            (tokens, manager.query_head_dim), generator=seeded_generator(2, self.seed, layer, rank)
        )
        return values.to(manager.output_dtype)

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
            odim = layer.manager.output_head_dim

            def attend(
                gathered: torch.Tensor, kv: torch.Tensor = kv, odim: int = odim
            ) -> tuple[torch.Tensor, torch.Tensor]:
                return partial_attention(gathered, kv, odim)

            outputs.append(_masked(layer.module.forward_decode(query, attend), layer.padding))
        return tuple(outputs)

    def reference(self, seed: int) -> tuple[torch.Tensor, ...]:
        """This rank's heads of whole-context attention, fp32 on CPU, for `make_inputs(seed)`.

        Queries are rounded to the layer's query dtype first, as the layer rounds them before the
        gather (fp8 under an fp8 KV cache). A rank's heads after the reduction are the queries it
        gathered out (heads are independent), so only its own queries meet the whole context.
        """
        results = []
        for i, layer in enumerate(self.layers):
            manager = layer.manager
            queries = self._query(seed, i, self.rank).to(manager.query_dtype)
            kv = torch.cat([self._kv(i, r) for r in range(self.world)], dim=0)
            out, _ = partial_attention(queries, kv, manager.output_head_dim)
            results.append(_masked(out, layer.padding))
        return tuple(results)
