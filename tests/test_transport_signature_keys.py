"""The registry keys transports on the whole signature (query dtype, output dtype, comm backend),
and the torch transport moves fp8 (e4m3) queries over gloo bit-exact, in 2-rank spawned jobs."""

from __future__ import annotations

import torch
from _support.gloo_spawn import gloo_group, spawn

from harness.core.signature import FP8_E4M3, TransportSignature
from harness.transport.combine import lse_combine
from harness.transport.events import RegistryMiss, TransportCreated
from harness.transport.registry import TransportRegistry
from harness.transport.testing import assert_matches, bit_equal, expected_gather, make_partials
from harness.warm.warmup import exercise

BF16 = TransportSignature("bf16", 8, 32, 16, 2, max_tokens=4)
FP8 = TransportSignature("bf16", 8, 32, 16, 2, max_tokens=4, query_dtype=FP8_E4M3)
A2A = TransportSignature("bf16", 8, 32, 16, 2, max_tokens=4, comm_backend="a2a")


def _every_fp8_byte(world: int, batch: int, heads: int, qdim: int) -> torch.Tensor:
    """`[W, B, h, q]` fp8 queries whose bytes run through all 256 patterns (NaNs and -0 too),
    shifted per rank, so a transport that converts instead of copying bytes is caught."""
    n = batch * heads * qdim
    codes = torch.stack([(torch.arange(n) + 37 * r) % 256 for r in range(world)])
    return codes.to(torch.uint8).view(torch.float8_e4m3fn).view(world, batch, heads, qdim)


def _fp8_gather_and_keys(rank: int, world: int, store: str) -> None:
    with gloo_group(rank, world, store):
        for strategy in ("ag_rs", "a2a"):
            registry = TransportRegistry(strategy=strategy)
            transport = registry.get_or_create(FP8)
            queries = _every_fp8_byte(world, 4, FP8.local_heads, FP8.query_head_dim)
            got = transport.gather_queries(queries[rank].contiguous())
            assert got.dtype is torch.float8_e4m3fn
            assert bit_equal(got, expected_gather(queries)), strategy
            out = torch.empty_like(got)
            assert transport.gather_queries(queries[rank].contiguous(), out=out) is out
            assert bit_equal(out, got)
            # The reduction of an fp8-query transport runs in its output dtype.
            parts = make_partials(world, 3, 8, 16, torch.bfloat16, pattern="mixed", seed=3)
            reduced = transport.reduce_outputs(*parts.of_rank(rank))
            assert reduced.dtype is torch.bfloat16
            assert_matches(reduced, lse_combine(parts.outputs, parts.lses, rank), what=strategy)
            exercise(transport, torch.device("cpu"))  # warmup's dummy step takes fp8 too

            # Same geometry, other query dtype: another transport, and a miss until created.
            seen: list[object] = []
            registry.subscribe(seen.append)
            assert registry.get(BF16) is None
            assert [type(e) for e in seen] == [RegistryMiss] and seen[0].signature == BF16
            assert registry.get_or_create(BF16) is not transport
            assert len(registry) == 2 and registry.get(FP8) is transport
            registry.close()


def test_fp8_queries_gather_bit_exact_and_key_their_own_transport() -> None:
    spawn(_fp8_gather_and_keys)


def _comm_backend_picks_the_reduction(rank: int, world: int, store: str) -> None:
    with gloo_group(rank, world, store):
        registry = TransportRegistry()  # no strategy: each signature's comm backend decides
        created: list[TransportCreated] = []
        registry.subscribe(lambda e: created.append(e) if isinstance(e, TransportCreated) else None)
        ag_rs, a2a = registry.get_or_create(BF16), registry.get_or_create(A2A)
        assert ag_rs is not a2a and len(registry) == 2
        assert [(e.signature, e.strategy) for e in created] == [(BF16, "ag_rs"), (A2A, "a2a")]
        assert "a2a_send" in a2a.buffers and "rs_send" in ag_rs.buffers
        parts = make_partials(world, 4, 8, 16, torch.bfloat16, pattern="mixed", seed=9)
        want = lse_combine(parts.outputs, parts.lses, rank)
        for transport in (ag_rs, a2a):
            assert_matches(transport.reduce_outputs(*parts.of_rank(rank)), want, what="reduce")
        # An explicit strategy overrides the signature's (the transport suites compare both).
        forced = TransportRegistry(strategy="a2a")
        assert forced.strategy_for(BF16) == "a2a"
        assert "a2a_send" in forced.get_or_create(BF16).buffers
        forced.close()
        registry.close()


def test_comm_backend_is_part_of_the_key_and_picks_the_reduction() -> None:
    spawn(_comm_backend_picks_the_reduction)
