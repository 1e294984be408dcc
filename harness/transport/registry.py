"""The transport registry: one transport per signature, created collectively, observable.

`get_or_create(signature, group)` is collective over `group` on every call, hit or miss: the
ranks first compare a 7-byte digest of (signature, backend, strategy, whether they already
hold it) in one small all_reduce; if the digests differ, every rank sees it and they all exchange
the full values with `all_gather_object` and raise the same `SignatureMismatchError`, naming the
differing values and ranks, instead of a hang in the creation collectives that would follow.
Non-collective lookups use `get` (the one to use inside a CUDA graph capture).

Observability (for the capture window and its detectors):
- `subscribe(callback) -> unsubscribe`: callbacks get `RegistryMiss`, `BufferAllocated` and
  `TransportCreated` values, in that order for a creation, and `OperationFirstUse` when a
  transport runs an operation (gather, reduce) with a dtype for the first time, before the
  operation's collectives (a transport is warm per operation and dtype, not per creation).
  A callback that raises stops the operation and its exception propagates out of
  `get`/`get_or_create`/`allocator.empty`/the transport's operation (on `TransportCreated`,
  the new transport is closed and not registered).
- `capture_scope(stream)`: enters, for a CUDA graph about to be captured on `stream`, the
  capture context of every held transport that has one (a b12x pool's graph channel, which
  b12x requires before capture begins); the capture window enters it before its warm-up.
- `frozen()`: a context manager marking everything that happens inside it as `frozen=True`.
  The registry still works while frozen; detectors decide what a frozen event means.
- `allocator`: the `CountingAllocator` through which transports allocate, so an allocation
  anywhere (even one a test makes on purpose) is counted and reported.
- `counters`: creations, buffer allocations and bytes, misses, hits, first uses.
- `operations(signature)`: the (operation, dtype) pairs a transport has run so far.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, Protocol

import torch
import torch.distributed as dist

from harness.core.signature import TransportSignature
from harness.errors import GeometryError, UsageError
from harness.transport.allocator import CountingAllocator
from harness.transport.errors import RegistryClosedError, SignatureMismatchError
from harness.transport.events import (
    BufferAllocated,
    OperationFirstUse,
    RegistryCounters,
    RegistryEvent,
    RegistryMiss,
    TransportCreated,
    short_stack,
)
from harness.transport.torch_backend import (
    REDUCE_SCATTER_IMPLS,
    STRATEGIES,
    TorchDCPTransport,
)
from harness.warm.protocols import DCPTransport

# Which transport implementations this process created ("torch:ag_rs", "torch:a2a", "b12x"),
# so the rank record can say which paths ran and the evidence which did not.
_TRANSPORTS_USED: set[str] = set()


class OwnedTransport(DCPTransport, Protocol):
    """A transport the registry created and must close (its buffers or b12x pools); warmup
    sees only `DCPTransport`, which has no `close`."""

    def close(self) -> None: ...


def transports_used() -> tuple[str, ...]:
    return tuple(sorted(_TRANSPORTS_USED))


BACKENDS: tuple[str, ...] = ("torch", "b12x")

Subscriber = Callable[[RegistryEvent], None]


def created_on(transport: DCPTransport, group: dist.ProcessGroup | None) -> bool:
    """Was `transport` created on `group`? One that names no group (a stand-in) is on any."""
    return getattr(transport, "group", group) is group


@contextmanager
def enter_capture_scopes(transports: Iterable[object], stream: Any = None) -> Iterator[None]:
    """Enter `capture_scope(stream)` of each transport that has one (b12x), in order; leave
    them in reverse. Transports without one (torch) need nothing before a capture."""
    with ExitStack() as stack:
        for transport in transports:
            scope = getattr(transport, "capture_scope", None)
            if scope is not None:
                stack.enter_context(scope(stream))
        yield None


def stand_in_backend(device: torch.device | str, dcp: int, facts: Any = None) -> tuple[str, str]:
    """(backend, why) for the stand-in suites: b12x on an sm_12x GPU with b12x (so a GPU run
    exercises it), torch elsewhere; `facts` (a `DeviceFacts`) defaults to this machine's."""
    from harness.transport.b12x_backend import device_facts, select_transport_backend

    return select_transport_backend(facts if facts is not None else device_facts(device), dcp)


def stand_in_registry(device: torch.device | str, dcp: int) -> TransportRegistry:
    """A registry on the backend `stand_in_backend` picks for this machine."""
    backend, _ = stand_in_backend(device, dcp)
    return TransportRegistry(backend, device=device)


def _global_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class TransportRegistry:
    """Creates (collectively) and looks up DCP transports by signature; see the module doc.

    `backend="torch"` takes `strategy` "ag_rs" or "a2a" and `reduce_scatter` "native" or
    "all_to_all"; `backend="b12x"` takes neither (its reduction is one fused kernel). With
    `strategy=None` (the default) each torch transport reduces with its signature's
    `comm_backend`, as vLLM picks its combine from `dcp_comm_backend`; an explicit strategy runs
    every signature through that one implementation (the transport suites compare them).
    """

    def __init__(
        self,
        backend: str = "torch",
        strategy: str | None = None,
        device: torch.device | str = "cpu",
        *,
        reduce_scatter: str = "native",
    ) -> None:
        if backend not in BACKENDS:
            raise UsageError(f"unknown transport backend {backend!r}; expected one of {BACKENDS}")
        if backend == "torch":
            if strategy is not None and strategy not in STRATEGIES:
                raise UsageError(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}")
            if reduce_scatter not in REDUCE_SCATTER_IMPLS:
                raise UsageError(
                    f"unknown reduce_scatter {reduce_scatter!r}; expected {REDUCE_SCATTER_IMPLS}"
                )
        elif strategy not in (None, "fused"):
            raise UsageError(f"backend 'b12x' has one fused strategy; got strategy={strategy!r}")
        else:
            strategy = "fused"
        self.backend = backend
        self.strategy = strategy
        self.reduce_scatter = reduce_scatter
        self.device = torch.device(device)
        self._transports: dict[TransportSignature, OwnedTransport] = {}
        self._subscribers: list[Subscriber] = []
        self._frozen_depth = 0
        self._closed = False
        self._creations = 0
        self._misses = 0
        self._hits = 0
        self._first_uses = 0
        self._operations: dict[TransportSignature, list[tuple[str, str]]] = {}
        self.allocator = CountingAllocator(
            self.device, self._emit_allocation, rank=_global_rank, frozen=lambda: self.is_frozen
        )

    # -- observability ----------------------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Deliver every future event to `callback`; returns a function that unsubscribes."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def _emit(self, event: RegistryEvent) -> None:
        for callback in tuple(self._subscribers):
            callback(event)

    def _emit_allocation(self, event: BufferAllocated) -> None:
        self._emit(event)

    @contextmanager
    def capture_scope(self, stream: Any) -> Iterator[None]:
        """Every held transport's capture context for a graph captured on `stream`; see the
        module doc. Collective where a transport's is (b12x): every rank enters it together."""
        held = [self._transports[s] for s in self.signatures()]
        with enter_capture_scopes(held, stream):
            yield None

    @contextmanager
    def frozen(self) -> Iterator[TransportRegistry]:
        """Mark everything inside as happening while frozen (nestable)."""
        self._frozen_depth += 1
        try:
            yield self
        finally:
            self._frozen_depth -= 1

    def strategy_for(self, signature: TransportSignature) -> str:
        """The reduction implementation the transport for `signature` uses on this registry."""
        if self.backend == "b12x":
            return "fused"
        return self.strategy or signature.comm_backend

    @property
    def is_frozen(self) -> bool:
        return self._frozen_depth > 0

    @property
    def counters(self) -> RegistryCounters:
        return RegistryCounters(
            creations=self._creations,
            buffer_allocations=self.allocator.allocations,
            buffer_bytes=self.allocator.nbytes,
            misses=self._misses,
            hits=self._hits,
            first_uses=self._first_uses,
        )

    def operations(self, signature: TransportSignature) -> tuple[tuple[str, str], ...]:
        """(operation, dtype) pairs the transport for `signature` has run, in first-use order."""
        return tuple(self._operations.get(signature, ()))

    def _used(self, signature: TransportSignature, operation: str, dtype: torch.dtype) -> None:
        """A transport is about to run `operation` on `dtype` tensors: report a first use.

        Recorded only after every subscriber accepted it, so an operation that a strict
        window stopped is still a first use next time."""
        name = str(dtype).removeprefix("torch.")
        done = self._operations.setdefault(signature, [])
        if (operation, name) in done:
            return
        self._emit(
            OperationFirstUse(
                signature=signature,
                operation=operation,
                dtype=name,
                stack=short_stack(),
                rank=_global_rank(),
                frozen=self.is_frozen,
            )
        )
        done.append((operation, name))
        self._first_uses += 1

    # -- lookup and creation ----------------------------------------------------------------

    def get(self, signature: TransportSignature) -> DCPTransport | None:
        """The transport for `signature`, or None (after a `RegistryMiss` event). Local."""
        self._check_open()
        transport = self._transports.get(signature)
        if transport is None:
            self._miss(signature, "get")
        else:
            self._hits += 1
        return transport

    def get_or_create(
        self, signature: TransportSignature, group: dist.ProcessGroup | None = None
    ) -> DCPTransport:
        """The transport for `signature` on `group` (default: the world), created if missing.

        Collective over `group` on every call; see the module doc. On a hit too: without it, a
        rank that holds the transport while a peer does not (or ranks that ask for two different
        held signatures) would go on into mismatched collectives instead of one clear error.
        """
        self._check_open()
        if not isinstance(signature, TransportSignature):
            raise UsageError(f"expected a TransportSignature, got {type(signature).__name__}")
        group = group if group is not None else dist.group.WORLD  # one identity for "the world"
        existing = self._transports.get(signature)
        if existing is None:
            self._miss(signature, "get_or_create")
        self._agree(signature, group, existing)
        if existing is not None:
            self._hits += 1
            return existing
        transport = self._create(signature, group)
        try:
            self._emit(
                TransportCreated(
                    signature=signature,
                    stack=short_stack(),
                    rank=_global_rank(),
                    backend=self.backend,
                    strategy=self.strategy_for(signature),
                    frozen=self.is_frozen,
                )
            )
        except BaseException:
            transport.close()
            raise
        self._transports[signature] = transport
        self._creations += 1
        return transport

    def _miss(self, signature: TransportSignature, op: str) -> None:
        self._misses += 1
        self._emit(
            RegistryMiss(
                signature=signature,
                op=op,
                stack=short_stack(),
                rank=_global_rank(),
                frozen=self.is_frozen,
            )
        )

    def _agree(
        self,
        signature: TransportSignature,
        group: dist.ProcessGroup | None,
        existing: DCPTransport | None,
    ) -> None:
        """Exchange what each rank asks for; raise the same error on every rank if they differ."""
        if existing is None:
            held = "absent"
        elif created_on(existing, group):
            held = "present"
        else:
            held = "present on another group"
        mine: tuple[Any, ...] = (signature, self.backend, self.strategy_for(signature), held)
        size = dist.get_world_size(group)
        if not self._digests_agree(mine, group):
            self._raise_disagreement(signature, mine, group, size)
        if held == "present on another group":
            raise SignatureMismatchError(
                f"transport [{signature.describe()}] already exists on another process group; "
                "a signature names one DCP group per rank"
            )
        if signature.dcp_world_size != size:
            raise GeometryError(
                f"transport [{signature.describe()}] needs a DCP group of "
                f"{signature.dcp_world_size} ranks, get_or_create got a group of {size}"
            )

    def _digests_agree(self, mine: tuple[Any, ...], group: dist.ProcessGroup | None) -> bool:
        """The cheap common case: one two-element all_reduce (MAX) of a 7-byte digest and its
        negation; max(d) == -max(-d) == min(d) exactly when every rank's digest is the same.
        (7 bytes keep the digest non-negative in int64, so its negation cannot overflow.)"""
        text = repr((mine[0].describe(), *mine[1:])).encode()
        digest = int.from_bytes(hashlib.blake2b(text, digest_size=7).digest(), "big")
        both = torch.tensor([digest, -digest], dtype=torch.int64, device=self.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
        highest, negated_lowest = both.tolist()
        return bool(highest == -negated_lowest)

    def _raise_disagreement(
        self,
        signature: TransportSignature,
        mine: tuple[Any, ...],
        group: dist.ProcessGroup | None,
        size: int,
    ) -> None:
        """Every rank of the group gets here together (they saw the same digests): exchange the
        full values and raise the same error, naming what differs and on which ranks."""
        gathered: list[Any] = [None] * size
        dist.all_gather_object(gathered, mine, group=group)
        ranks = dist.get_process_group_ranks(group)
        renders: tuple[tuple[str, Callable[[Any], str]], ...] = (
            ("signatures", lambda s: s.describe()),
            ("backends", str),
            ("strategies", str),
            ("registry states", str),
        )
        for index, (label, render) in enumerate(renders):
            values: dict[str, list[int]] = {}
            for rank, entry in zip(ranks, gathered, strict=True):
                values.setdefault(render(entry[index]), []).append(rank)
            if len(values) > 1:
                detail = "; ".join(f"ranks {r}: {v}" for v, r in values.items())
                raise SignatureMismatchError(
                    f"ranks of one DCP group disagree on transport {label} in get_or_create "
                    f"(rank {_global_rank()} asked for [{signature.describe()}]): {detail}"
                )
        raise AssertionError(f"digests differ but the values agree: {gathered}")

    def _create(
        self, signature: TransportSignature, group: dist.ProcessGroup | None
    ) -> OwnedTransport:
        strategy = self.strategy_for(signature)
        _TRANSPORTS_USED.add(self.backend if self.backend == "b12x" else f"torch:{strategy}")
        on_use = functools.partial(self._used, signature)
        if self.backend == "torch":
            return TorchDCPTransport(
                signature,
                group,
                allocator=self.allocator,
                strategy=strategy,
                reduce_scatter=self.reduce_scatter,
                on_use=on_use,
            )
        from harness.transport.b12x_backend import B12xDCPTransport

        return B12xDCPTransport(signature, group, allocator=self.allocator, on_use=on_use)

    # -- listing and teardown ---------------------------------------------------------------

    def signatures(self) -> tuple[TransportSignature, ...]:
        """Signatures held, sorted (deterministic across ranks)."""
        return tuple(sorted(self._transports))

    @property
    def created(self) -> tuple[TransportSignature, ...]:
        """Signatures held, in creation order."""
        return tuple(self._transports)

    def __contains__(self, signature: object) -> bool:
        return signature in self._transports

    def __len__(self) -> int:
        return len(self._transports)

    def close(self) -> None:
        """Close every transport (b12x pools are collective to close); idempotent."""
        if self._closed:
            return
        self._closed = True
        transports, self._transports = list(self._transports.values()), {}
        self._operations.clear()
        for transport in transports:
            transport.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RegistryClosedError("the transport registry is closed")

    def __enter__(self) -> TransportRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
