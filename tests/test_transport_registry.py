"""The transport registry and the torch transport: local behaviour in-process, collective
behaviour in a 2-rank gloo job spawned per test (the pytest worker never holds a process group).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from _support.gloo_spawn import gloo_group, spawn

from harness.core.signature import TransportSignature
from harness.errors import GeometryError, UsageError
from harness.transport.combine import lse_combine
from harness.transport.errors import (
    CapacityError,
    RegistryClosedError,
    SignatureMismatchError,
    TransportUsageError,
)
from harness.transport.events import (
    BufferAllocated,
    OperationFirstUse,
    RegistryCounters,
    RegistryMiss,
    TransportCreated,
)
from harness.transport.registry import TransportRegistry, enter_capture_scopes
from harness.transport.testing import (
    assert_matches,
    bit_equal,
    expected_gather,
    make_partials,
    make_queries,
)
from harness.warm.protocols import DCPTransport, TransportRegistryLike

SIG = TransportSignature("bf16", 8, 24, 16, 2, max_tokens=4)

# -- local (no process group) ----------------------------------------------------------------


def test_registry_satisfies_the_warm_protocol() -> None:
    assert isinstance(TransportRegistry(), TransportRegistryLike)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "nccl"}, "unknown transport backend"),
        ({"strategy": "ring"}, "unknown strategy"),
        ({"reduce_scatter": "tree"}, "unknown reduce_scatter"),
        ({"backend": "b12x", "strategy": "a2a"}, "one fused strategy"),
    ],
)
def test_bad_registry_arguments(kwargs, message) -> None:
    with pytest.raises(UsageError, match=message):
        TransportRegistry(**kwargs)


def test_get_miss_is_an_event_and_a_count() -> None:
    registry = TransportRegistry()
    seen: list[object] = []
    unsubscribe = registry.subscribe(seen.append)
    assert registry.get(SIG) is None
    with registry.frozen():
        assert registry.is_frozen
        with registry.frozen():
            assert registry.get(SIG) is None
        assert registry.is_frozen
    assert not registry.is_frozen
    unsubscribe()
    unsubscribe()  # idempotent
    assert registry.get(SIG) is None
    assert [type(e) for e in seen] == [RegistryMiss, RegistryMiss]
    assert [e.frozen for e in seen] == [False, True]
    assert seen[0].op == "get" and seen[0].signature == SIG
    assert "test_transport_registry.py" in seen[0].stack
    assert registry.counters == RegistryCounters(misses=3)


def test_allocator_counts_and_reports_a_deliberate_allocation() -> None:
    registry = TransportRegistry()
    seen: list[BufferAllocated] = []
    registry.subscribe(seen.append)
    with registry.frozen():
        t = registry.allocator.empty((3, 4), torch.bfloat16, owner=SIG, name="probe")
    registry.allocator.record_external(1000, owner=None, name="slab")
    assert t.shape == (3, 4) and t.dtype == torch.bfloat16
    assert [(e.name, e.nbytes, e.frozen) for e in seen] == [
        ("probe", 24, True),
        ("slab", 1000, False),
    ]
    assert registry.counters.buffer_allocations == 2
    assert registry.counters.buffer_bytes == 1024
    assert seen[0].signature is not None and seen[0].signature.total_heads == 8


def test_a_raising_subscriber_stops_the_allocation() -> None:
    registry = TransportRegistry()

    def refuse(event: object) -> None:
        raise RuntimeError(f"lazy: {type(event).__name__}")

    registry.subscribe(refuse)
    with pytest.raises(RuntimeError, match="lazy: BufferAllocated"):
        registry.allocator.empty((2,), torch.float32, owner=None, name="x")
    with pytest.raises(RuntimeError, match="lazy: RegistryMiss"):
        registry.get(SIG)
    assert registry.counters.buffer_allocations == 0


def test_closed_registry_refuses_use() -> None:
    registry = TransportRegistry()
    registry.close()
    registry.close()
    with pytest.raises(RegistryClosedError):
        registry.get(SIG)
    with pytest.raises(RegistryClosedError):
        registry.get_or_create(SIG)


# -- collective (2 ranks, spawned) --------------------------------------------------------------


def _creation_and_events(rank: int, world: int, store: str) -> None:
    with gloo_group(rank, world, store):
        registry = TransportRegistry(strategy="a2a")
        seen: list[object] = []
        registry.subscribe(seen.append)
        with registry.frozen():
            transport = registry.get_or_create(SIG)
        assert isinstance(transport, DCPTransport)
        kinds = [type(e).__name__ for e in seen]
        assert kinds[0] == "RegistryMiss" and kinds[-1] == "TransportCreated", kinds
        # A2A's nine: the gather's two, the exchange's two, the accumulation's four, the
        # weights' scratch.
        assert set(kinds[1:-1]) == {"BufferAllocated"} and len(kinds) == 11, kinds
        assert all(e.frozen for e in seen), seen
        created = seen[-1]
        assert isinstance(created, TransportCreated)
        assert (created.rank, created.backend, created.strategy) == (rank, "torch", "a2a")
        counters = registry.counters
        assert counters.creations == 1 and counters.buffer_allocations == 9
        assert counters.buffer_bytes == sum(transport.buffers.values())

        # A hit creates nothing, emits nothing, allocates nothing: static buffers only.
        seen.clear()
        assert registry.get_or_create(SIG, dist.group.WORLD) is transport
        assert registry.get(SIG) is transport
        queries = make_queries(world, 4, SIG.local_heads, 24, torch.bfloat16, seed=1)
        for batch in (1, 4, 2):
            got = transport.gather_queries(queries[rank, :batch].contiguous())
            assert bit_equal(got, expected_gather(queries[:, :batch]))
            parts = make_partials(world, batch, 8, 16, torch.bfloat16, pattern="mixed", seed=2)
            out = torch.full((batch, 4, 16), 7.0, dtype=torch.bfloat16)
            result = transport.reduce_outputs(*parts.of_rank(rank), out=out)
            assert result is out
            assert_matches(out, lse_combine(parts.outputs, parts.lses, rank), what="a2a")
        # The only events: the first gather and the first reduction with bf16, once each.
        firsts = [(e.operation, e.dtype, e.frozen) for e in seen]
        assert all(isinstance(e, OperationFirstUse) for e in seen), seen
        assert firsts == [("gather", "bfloat16", False), ("reduce", "bfloat16", False)]
        assert registry.operations(SIG) == (("gather", "bfloat16"), ("reduce", "bfloat16"))
        assert registry.counters.creations == 1 and registry.counters.first_uses == 2
        assert registry.counters.buffer_allocations == 9 and registry.counters.hits == 2
        assert registry.signatures() == (SIG,) and registry.created == (SIG,)

        # Capacity and shape errors are local and clear; no collective was started.
        with pytest.raises(CapacityError, match="batch of 5 tokens exceeds max_tokens=4"):
            transport.gather_queries(torch.zeros(5, 4, 24, dtype=torch.bfloat16))
        with pytest.raises(TransportUsageError, match=r"must be torch.bfloat16, got torch.float32"):
            transport.gather_queries(torch.zeros(1, 4, 24))
        with pytest.raises(TransportUsageError, match=r"must have shape \[1, 8, 16\]"):
            transport.reduce_outputs(torch.zeros(1, 4, 16, dtype=torch.bfloat16), torch.zeros(1, 8))
        with pytest.raises(TransportUsageError, match=r"partial_lse .* must be torch.float32"):
            transport.reduce_outputs(
                torch.zeros(1, 8, 16, dtype=torch.bfloat16), torch.zeros(1, 8).half()
            )

        # A transport created while a subscriber refuses is not registered.
        other = TransportSignature("fp32", 8, 24, 16, 2, max_tokens=4)

        def refuse_creation(event: object) -> None:
            if isinstance(event, TransportCreated):
                raise RuntimeError("no creation inside the window")

        unsubscribe = registry.subscribe(refuse_creation)
        with pytest.raises(RuntimeError, match="no creation inside the window"):
            registry.get_or_create(other)
        unsubscribe()
        assert other not in registry and registry.counters.creations == 1

        registry.close()
        with pytest.raises(RegistryClosedError):
            transport.gather_queries(queries[rank, :1].contiguous())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_creation_events_hits_and_static_buffers() -> None:
    spawn(_creation_and_events)


def _disagreements(rank: int, world: int, store: str) -> None:
    with gloo_group(rank, world, store):
        registry = TransportRegistry()
        # Different signatures: every rank raises, naming both.
        mine = SIG if rank == 0 else TransportSignature("fp16", 8, 24, 16, 2, max_tokens=4)
        with pytest.raises(SignatureMismatchError) as info:
            registry.get_or_create(mine)
        message = str(info.value)
        del info  # its traceback holds the group; none may outlive `gloo_group`'s destroy
        assert "ranks [0]: 8 heads x 24 -> 16 (bf16" in message, message
        assert "ranks [1]: 8 heads x 24 -> 16 (fp16" in message, message
        assert len(registry) == 0

        # Different strategies across ranks.
        mixed = TransportRegistry(strategy="ag_rs" if rank == 0 else "a2a")
        with pytest.raises(SignatureMismatchError, match="disagree on transport strategies"):
            mixed.get_or_create(SIG)

        # One rank holds the transport, the other does not (a fresh registry).
        registry.get_or_create(SIG)
        lopsided = registry if rank == 0 else TransportRegistry()
        with pytest.raises(SignatureMismatchError, match="registry states"):
            lopsided.get_or_create(SIG)

        # A signature whose DCP size is not the group's: the same error on every rank.
        wrong = TransportSignature("bf16", 8, 24, 16, 4, max_tokens=4)
        with pytest.raises(GeometryError, match="needs a DCP group of 4 ranks"):
            registry.get_or_create(wrong)

        # The registry still works afterwards: the failures left no collective half-done.
        assert registry.get_or_create(SIG) is registry.get(SIG)
        registry.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_disagreement_is_an_error_on_every_rank_not_a_hang() -> None:
    spawn(_disagreements)


def _strategies_agree(rank: int, world: int, store: str) -> None:
    with gloo_group(rank, world, store):
        sig = TransportSignature("fp32", 8, 24, 16, 2, max_tokens=3)
        results: list[list[torch.Tensor]] = []
        for strategy, rs in (("ag_rs", "native"), ("ag_rs", "all_to_all"), ("a2a", "native")):
            registry = TransportRegistry(strategy=strategy, reduce_scatter=rs)
            transport = registry.get_or_create(sig)
            parts = make_partials(world, 3, 8, 16, torch.float32, pattern="mixed", seed=4)
            results.append([])
            for base_e in (True, False):
                got = transport.reduce_outputs(*parts.of_rank(rank), base_e=base_e)
                want = lse_combine(parts.outputs, parts.lses, rank, base_e=base_e)
                assert_matches(got, want, what=f"{strategy}/{rs} base_e={base_e}")
                results[-1].append(got)
            registry.close()
        for other in results[1:]:
            for got, first in zip(other, results[0], strict=True):
                assert_matches(got, first, what="strategies agree")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_every_strategy_matches_the_oracle() -> None:
    spawn(_strategies_agree)


# -- the capture scope the window enters before a CUDA graph capture ---------------------------


class Scoped:
    """A transport with a capture context (as the b12x one has), recording its use."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    @contextlib.contextmanager
    def capture_scope(self, stream: object) -> Iterator[None]:
        self.log.append(f"enter {self.name} on {stream}")
        yield
        self.log.append(f"exit {self.name}")


def test_capture_scopes_are_entered_in_order_and_left_in_reverse() -> None:
    log: list[str] = []
    plain = object()  # a torch transport: nothing to enter
    with enter_capture_scopes([Scoped("a", log), plain, Scoped("b", log)], "side"):
        log.append("capture")
    assert log == ["enter a on side", "enter b on side", "capture", "exit b", "exit a"]


def test_the_registry_enters_every_held_transport_in_signature_order() -> None:
    log: list[str] = []
    registry = TransportRegistry()
    small = TransportSignature("bf16", 8, 24, 16, 2)
    large = TransportSignature("bf16", 96, 576, 512, 2)
    registry._transports[large] = Scoped("large", log)  # type: ignore[assignment]
    registry._transports[small] = Scoped("small", log)  # type: ignore[assignment]
    with registry.capture_scope("side"):
        log.append("capture")
    assert log[0] == f"enter {'small' if small < large else 'large'} on side"
    assert log[2] == "capture" and len(log) == 5
    registry._transports.clear()
