"""Output reduction over 2, 4 and 16 ranks: every implementation matches the independent
float64 reference (`harness.transport.reference`, which shares no code with the transports;
fp32 1e-5, 16-bit 2e-2 relative) on every adversarial LSE pattern, in base e and 2; AG+RS
equals A2A; one-hot inputs prove the routing exactly; the same seed gives the same bits.

Every rank builds the group's partials from the same seed (only the blocks it needs), reduces
its own partial, and checks its heads against the reference on its head block.
"""

from __future__ import annotations

import functools
import zlib

import pytest
import torch

from harness.transport.dtypes import output_torch_dtype
from harness.transport.errors import CapacityError
from harness.transport.testing import (
    ADVERSARIAL,
    DCP_SIZES,
    IMPLS,
    MODELS,
    SUITE_MAX_TOKENS,
    Partials,
    Variants,
    assert_matches,
    bit_equal,
    make_partials,
)

# LSE bases by the names the cases report: e (natural log) and 2 (log2 LSEs).
BASES = {"base_e": True, "base_2": False}


def _seed(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode())


def _partials(sig, batch: int, pattern: str, seed: int) -> Partials:
    """The whole group's partials for a signature (every rank builds the same)."""
    return make_partials(
        sig.dcp_world_size,
        batch,
        sig.total_heads,
        sig.output_head_dim,
        output_torch_dtype(sig),
        pattern=pattern,
        seed=seed,
    )


# The implementations of one geometry are adjacent cases that reduce the same inputs against
# the same oracle: built once for them (`Partials` keeps its blocks and its oracle results).
_shared_partials = functools.lru_cache(maxsize=2)(_partials)


def _reduce(transport, parts, rank, device, base_e):
    out, lse = parts.of_rank(rank)
    return transport.reduce_outputs(out.to(device), lse.to(device), base_e=base_e).cpu()


@pytest.mark.parametrize("impl", ["ag_rs", "a2a"])  # ag_rs_a2a: in every other test here
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_reduction_matches_oracle(dcp, model, dtype, impl, dcp_group, transports, world) -> None:
    """Mixed adversarial patterns (every kind in one tensor), both LSE bases."""
    group = dcp_group(dcp)
    spec = MODELS[model]
    sig = spec.signature(dtype, dcp, world.device.type)
    transport = transports.get(impl, sig, group.group)
    parts = _shared_partials(sig, 3, "mixed", _seed(dcp, model, dtype))
    variants = Variants()
    for base, base_e in BASES.items():
        got = _reduce(transport, parts, group.rank, world.device, base_e)
        expected = parts.expected(group.rank, base_e=base_e)
        with variants.check(base):
            assert_matches(got, expected, what=f"{impl} {base} rank {group.rank}")
    variants.assert_all_passed()


@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_adversarial_patterns(dcp, dcp_group, transports, world) -> None:
    """Each adversarial LSE pattern alone (Kimi-K3 geometry, bf16), in both LSE bases, through every
    implementation; one case per DCP size that names every (pattern, base, implementation)
    that failed."""
    group = dcp_group(dcp)
    spec = MODELS["kimi-k3"]
    sig = spec.signature("bf16", dcp, world.device.type)
    by_impl = {impl: transports.get(impl, sig, group.group) for impl in IMPLS}
    variants = Variants()
    for pattern in ADVERSARIAL:
        parts = _partials(sig, 2, pattern, _seed(dcp, pattern))
        for base, base_e in BASES.items():
            expected = parts.expected(group.rank, base_e=base_e)
            for impl, transport in by_impl.items():
                got = _reduce(transport, parts, group.rank, world.device, base_e)
                with variants.check(f"{pattern} {base} {impl}"):
                    assert_matches(got, expected, what=f"{impl} {pattern} rank {group.rank}")
                    if pattern == "all_empty":
                        zero = torch.zeros_like(got)
                        assert bit_equal(got, zero), f"{impl}: all-empty is not exactly 0"
    variants.assert_all_passed()


@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_one_hot_routing_is_exact(dcp, dcp_group, transports, world) -> None:
    """One live rank per (token, head): the result is that rank's output, bit for bit, and its
    encoded channels name the source rank, the global head and the token."""
    group = dcp_group(dcp)
    spec = MODELS["deepseek-v4"]
    sig = spec.signature("bf16", dcp, world.device.type)
    parts = _partials(sig, SUITE_MAX_TOKENS, "one_hot", _seed(dcp, "one_hot"))
    h = sig.local_heads
    block, block_lses = parts.head_block(group.rank)  # [W, B, h, D], [W, B, h]
    live = torch.isfinite(block_lses).int().argmax(dim=0)  # [B, h]: the one live source rank
    heads = torch.arange(group.rank * h, (group.rank + 1) * h, dtype=torch.float32)
    for impl in IMPLS:
        transport = transports.get(impl, sig, group.group)
        got = _reduce(transport, parts, group.rank, world.device, True)
        assert torch.equal(got[..., 0].float(), live.float() + 1), f"{impl}: wrong source rank"
        assert torch.equal(got[..., 1].float(), heads.expand_as(live) + 1), f"{impl}: wrong head"
        tokens = torch.arange(SUITE_MAX_TOKENS, dtype=torch.float32).view(-1, 1)
        assert torch.equal(got[..., 2].float(), tokens.expand_as(live) + 1), f"{impl}: token"
        index = live[None, :, :, None].expand(1, -1, -1, got.shape[-1])
        picked = torch.gather(block, 0, index)[0]
        assert bit_equal(got, picked), f"{impl}: not bit-exact"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_ag_rs_equals_a2a(dcp, dtype, dcp_group, transports, world) -> None:
    group = dcp_group(dcp)
    spec = MODELS["kimi-k3"]
    sig = spec.signature(dtype, dcp, world.device.type)
    parts = _partials(sig, 3, "random", _seed(dcp, dtype, "agrs=a2a"))
    results = {}
    for impl in IMPLS:
        transport = transports.get(impl, sig, group.group)
        results[impl] = _reduce(transport, parts, group.rank, world.device, True)
    for impl in ("ag_rs", "ag_rs_a2a"):
        assert_matches(results[impl], results["a2a"], what=f"{impl} vs a2a")


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_same_seed_same_bits(dcp, impl, dcp_group, transports, world) -> None:
    group = dcp_group(dcp)
    spec = MODELS["kimi-k3"]
    sig = spec.signature("bf16", dcp, world.device.type)
    transport = transports.get(impl, sig, group.group)
    runs = []
    for _ in range(2):
        parts = _partials(sig, 2, "mixed", _seed(dcp, "twice"))
        runs.append(_reduce(transport, parts, group.rank, world.device, True))
    assert bit_equal(runs[0], runs[1])


@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_capacity_is_fixed_at_creation(dcp, dcp_group, registries, transports, world) -> None:
    """A batch of max_tokens works; one more is a clear error, on every rank, before any
    collective; and no call allocates anything after creation."""
    group = dcp_group(dcp)
    spec = MODELS["kimi-k3"]
    sig = spec.signature("bf16", dcp, world.device.type)
    registry = registries["ag_rs"]
    transport = transports.get("ag_rs", sig, group.group)
    before = registry.counters
    for batch in (SUITE_MAX_TOKENS, 1):
        parts = _partials(sig, batch, "random", batch)
        _reduce(transport, parts, group.rank, world.device, True)
    too_big = SUITE_MAX_TOKENS + 1
    like = {"dtype": output_torch_dtype(sig), "device": world.device}
    big_out = torch.zeros(too_big, sig.total_heads, spec.output_head_dim, **like)
    big_lse = torch.zeros(too_big, sig.total_heads, device=world.device)
    with pytest.raises(CapacityError, match=f"batch of {too_big} tokens exceeds max_tokens"):
        transport.reduce_outputs(big_out, big_lse)
    with pytest.raises(CapacityError):
        transport.gather_queries(torch.zeros(too_big, sig.local_heads, spec.query_head_dim, **like))
    after = registry.counters
    assert (after.buffer_allocations, after.buffer_bytes, after.creations) == (
        before.buffer_allocations,
        before.buffer_bytes,
        before.creations,
    )
