"""The capture oracle read from vLLM's own call sites, independent of the recognizers.

Three pieces, none of which reads a recognizer or a layer attribute the warm code reads:

- `watch_managers()` wraps `MLADCPManager.__init__` while real trees are built and records the
  arguments each layer's constructor itself passed (local heads, query/output head dims, query
  and output dtypes) plus what the manager made of the config (token capacity from
  `get_dcp_workspace_max_num_tokens`, a2a or ag_rs, the DCP group's size).
- `CallSiteRouter` replaces each manager's `query_gather` and `combine` (vLLM's real combines
  are Triton-only) with calls into our transport registry, keyed by the tensors the call site
  hands over and the manager's recorded capacity and comm backend. A key not in the registry is
  created on first use: inside a capture window that is a lazy event the detectors report.
- `RealDecodeStep` drives one decode step through every registered layer's manager, with
  queries shaped and typed as the manager's constructor was told, an MQA of its own over a
  per-rank latent shard, and the partials through `combine`, as Kimi-K3's decode path does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from harness.core.capacity import SEED_RUNTIME, RuntimeCapacity
from harness.core.signature import TransportSignature
from harness.errors import UsageError
from harness.transport.dtypes import dtype_name
from harness.transport.registry import TransportRegistry
from harness.warm.protocols import DCPTransport


@dataclass(frozen=True)
class ManagerCall:
    """What one `MLADCPManager(...)` construction was asked for, and what it sized itself to."""

    num_heads: int
    query_head_dim: int
    output_head_dim: int
    query_dtype: str
    output_dtype: str
    max_num_tokens: int
    comm_backend: str
    dcp_world_size: int


@dataclass(frozen=True, order=True)
class CallSiteKey:
    """The transport one call site used: taken from the tensors it handed over."""

    local_heads: int
    query_head_dim: int
    output_head_dim: int
    query_dtype: str
    output_dtype: str
    max_tokens: int
    comm_backend: str
    dcp_world_size: int

    def describe(self) -> str:
        return (
            f"{self.local_heads * self.dcp_world_size} heads x {self.query_head_dim} -> "
            f"{self.output_head_dim} (query {self.query_dtype}, output {self.output_dtype}, "
            f"dcp={self.dcp_world_size}, max_tokens={self.max_tokens}, {self.comm_backend})"
        )

    @classmethod
    def built_for(cls, call: ManagerCall) -> CallSiteKey:
        """The key a manager's constructor sized it for (what its call sites will hand over)."""
        return cls(
            call.num_heads,
            call.query_head_dim,
            call.output_head_dim,
            call.query_dtype,
            call.output_dtype,
            call.max_num_tokens,
            call.comm_backend,
            call.dcp_world_size,
        )

    def signature(self, device_type: str = "cpu") -> TransportSignature:
        """The registry's signature for this key (query and output dtypes kept apart)."""
        return TransportSignature(
            dtype=dtype_name(_dtype_of(self.output_dtype)),
            query_dtype=dtype_name(_dtype_of(self.query_dtype)),
            total_heads=self.local_heads * self.dcp_world_size,
            query_head_dim=self.query_head_dim,
            output_head_dim=self.output_head_dim,
            dcp_world_size=self.dcp_world_size,
            max_tokens=self.max_tokens,
            device_type=device_type,
            comm_backend=self.comm_backend,
        )


def _dtype(value: torch.dtype) -> str:
    return str(value).removeprefix("torch.")


@contextmanager
def watch_managers(
    runtime: RuntimeCapacity = SEED_RUNTIME,
) -> Iterator[dict[int, ManagerCall]]:
    """Record every `MLADCPManager` built inside, keyed by `id(manager)`. The token capacity
    recorded is the one the fork's B12X runtime sizes the layer's transport to: the manager's
    own (`get_dcp_workspace_max_num_tokens`) under `runtime`'s cap."""
    from vllm.v1.attention.ops.dcp import MLADCPManager

    calls: dict[int, ManagerCall] = {}
    original = MLADCPManager.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        names = (
            "vllm_config",
            "device",
            "num_heads",
            "query_head_dim",
            "output_head_dim",
            "query_dtype",
            "output_dtype",
        )
        bound = {**dict(zip(names, args, strict=False)), **kwargs}
        calls[id(self)] = ManagerCall(
            num_heads=int(bound["num_heads"]),
            query_head_dim=int(bound["query_head_dim"]),
            output_head_dim=int(bound["output_head_dim"]),
            query_dtype=_dtype(bound["query_dtype"]),
            output_dtype=_dtype(bound["output_dtype"]),
            max_num_tokens=runtime.tokens(int(self.max_num_tokens)),
            comm_backend="a2a" if self.use_a2a else "ag_rs",
            dcp_world_size=int(self.group.world_size),
        )

    MLADCPManager.__init__ = recording_init
    try:
        yield calls
    finally:
        MLADCPManager.__init__ = original


@dataclass(frozen=True)
class CallSite:
    """One registered layer with a DCP manager, and what its manager was built for."""

    name: str
    layer: nn.Module
    manager: Any
    call: ManagerCall


def call_sites(
    static_forward_context: Mapping[str, nn.Module], calls: Mapping[int, ManagerCall]
) -> tuple[CallSite, ...]:
    """Every forward-context layer whose `dcp_manager` was recorded being built and runs its
    collectives through the B12X transport. A generic `MLAAttention` whose `dcp_b12x` gate is
    closed (another backend, ag_rs, a DCP size outside 2/4/8) keeps vLLM's own collectives,
    which no B12X warm covers or needs to: it is not a call site of the transport."""
    sites = []
    for name, layer in static_forward_context.items():
        manager = getattr(layer, "dcp_manager", None)
        if getattr(layer, "dcp_b12x", True) is False:
            continue
        if manager is not None and id(manager) in calls:
            sites.append(CallSite(name, layer, manager, calls[id(manager)]))
    return tuple(sites)


def warm_exactly(
    sites: tuple[CallSite, ...],
    registry: TransportRegistry,
    group: Any,
    *,
    skip: frozenset[str] = frozenset(),
) -> tuple[TransportSignature, ...]:
    """Create the transport every site's manager was built for, except sites named in `skip`,
    and run one zero gather and one zero reduction through it in the site's own dtypes: the
    best any warm can do, so a control built on it isolates one mistake (say, skipping the
    draft) from every other. Collective: call on every rank with the same sites."""
    made: dict[TransportSignature, None] = {}
    device = registry.device
    for site in sites:
        call = site.call
        signature = CallSiteKey.built_for(call).signature(device.type)
        if site.name in skip or signature in made:
            continue
        transport = registry.get_or_create(signature, group)
        query_shape = (1, call.num_heads, call.query_head_dim)
        transport.gather_queries(
            torch.zeros(query_shape, dtype=_dtype_of(call.query_dtype), device=device)
        )
        total = call.num_heads * call.dcp_world_size
        output_shape = (1, total, call.output_head_dim)
        transport.reduce_outputs(
            torch.zeros(output_shape, dtype=_dtype_of(call.output_dtype), device=device),
            torch.zeros((1, total), dtype=torch.float32, device=device),
        )
        made[signature] = None
    return tuple(made)


class CallSiteRouter:
    """Routes every manager's `query_gather`/`combine` through one registry (see module doc)."""

    def __init__(
        self, sites: tuple[CallSite, ...], registry: TransportRegistry, group: Any
    ) -> None:
        self.sites = sites
        self.registry = registry
        self.group = group
        self.used: set[CallSiteKey] = set()
        self.served: set[TransportSignature] = set()  # the registry's signatures that served
        self.device_type = registry.device.type
        self._saved: list[tuple[Any, Any, Any]] = []

    def covering(self, key: CallSiteKey) -> TransportSignature | None:
        """The registered signature serving `key`: exactly its own, or None. Every fork registry
        looks a transport up by its exact key, token capacity included, so a transport warmed
        for a larger capacity does not serve a smaller one: the runtime misses it."""
        wanted = key.signature(self.device_type)
        return wanted if wanted in self.registry.signatures() else None

    def _transport(self, key: CallSiteKey) -> DCPTransport:
        self.used.add(key)
        signature = self.covering(key)
        transport: DCPTransport | None
        if signature is None:  # first use: created here, collectively (the lazy work)
            signature = key.signature(self.device_type)
            transport = self.registry.get_or_create(signature, self.group)
        else:
            transport = self.registry.get(signature)
        assert transport is not None, f"covering() names a held signature, not {signature}"
        self.served.add(signature)
        return transport

    def _gather(self, call: ManagerCall, query: torch.Tensor) -> torch.Tensor:
        # Only the query is known here; the output side comes from the same manager.
        key = CallSiteKey(
            int(query.shape[1]),
            int(query.shape[2]),
            call.output_head_dim,
            _dtype(query.dtype),
            call.output_dtype,
            call.max_num_tokens,
            call.comm_backend,
            call.dcp_world_size,
        )
        return self._transport(key).gather_queries(query)

    def _combine(
        self, call: ManagerCall, partial: torch.Tensor, lse: torch.Tensor, **_: Any
    ) -> torch.Tensor:
        key = CallSiteKey(
            int(partial.shape[1]) // call.dcp_world_size,
            call.query_head_dim,
            int(partial.shape[2]),
            call.query_dtype,
            _dtype(partial.dtype),
            call.max_num_tokens,
            call.comm_backend,
            call.dcp_world_size,
        )
        return self._transport(key).reduce_outputs(partial, lse)

    def install(self) -> CallSiteRouter:
        for site in self.sites:
            manager, call = site.manager, site.call
            self._saved.append((manager, manager.query_gather, manager.combine))
            manager.query_gather = lambda q, _call=call: self._gather(_call, q)
            manager.combine = lambda o, lse, _call=call, **kw: self._combine(_call, o, lse, **kw)
        return self

    def remove(self) -> None:
        for manager, gather, combine in reversed(self._saved):
            manager.query_gather, manager.combine = gather, combine
        self._saved.clear()

    def __enter__(self) -> CallSiteRouter:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _generator(*parts: int) -> torch.Generator:
    seed = 0
    for part in parts:
        seed = (seed * 7_919 + part) % (2**61 - 1)
    return torch.Generator().manual_seed(seed)


def _dtype_of(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise UsageError(f"unknown torch dtype {name!r}")
    return value


class RealDecodeStep:
    """One decode step through every call site's manager (see the module doc)."""

    def __init__(
        self, sites: tuple[CallSite, ...], *, rank: int, batch: int = 2, kv_tokens: int = 3
    ) -> None:
        if not sites:
            raise UsageError("no layer of the real tree built a DCP manager")
        self.sites = sites
        self.rank = rank
        self.batch = batch
        self.kv = tuple(
            torch.randn(
                (kv_tokens + rank % 3, site.call.query_head_dim),
                generator=_generator(2, i, rank),
            )
            for i, site in enumerate(sites)
        )

    def make_inputs(self, seed: int) -> tuple[torch.Tensor, ...]:
        out = []
        for i, site in enumerate(self.sites):
            shape = (self.batch, site.call.num_heads, site.call.query_head_dim)
            values = torch.randn(shape, generator=_generator(1, seed, i, self.rank))
            out.append(values.to(_dtype_of(site.call.query_dtype)))
        return tuple(out)

    def __call__(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        outputs = []
        for site, query, kv in zip(self.sites, inputs, self.kv, strict=True):
            gathered = site.manager.query_gather(query)
            q = gathered.to(torch.float32)
            scores = torch.einsum("bhd,td->bht", q, kv) / math.sqrt(q.shape[-1])
            lse = torch.logsumexp(scores, dim=-1)
            values = kv[:, : site.call.output_head_dim]
            partial = torch.einsum("bht,td->bhd", torch.softmax(scores, dim=-1), values)
            partial = partial.to(_dtype_of(site.call.output_dtype))
            outputs.append(site.manager.combine(partial, lse))
        return tuple(outputs)
