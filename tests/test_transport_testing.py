"""The transport suite's helpers: one case over data-only variants reports every failing
variant; a suite's transports are created collectively once and fetched locally after; a
world's partials compute their oracle once per rank and base."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _support.gloo_spawn import gloo_group, spawn

from harness.core.signature import TransportSignature
from harness.transport.reference import reference_combine_heads
from harness.transport.registry import TransportRegistry
from harness.transport.testing import SuiteTransports, Variants, bit_equal, make_partials

SIG = TransportSignature("bf16", 8, 24, 16, 2, max_tokens=4)
OTHER = TransportSignature("fp16", 8, 24, 16, 2, max_tokens=4)

# -- Variants ---------------------------------------------------------------------------------


def test_variants_that_all_pass_pass() -> None:
    variants = Variants()
    for name in ("a", "b"):
        with variants.check(name):
            assert name
    variants.assert_all_passed()
    assert (variants.checked, variants.failed) == (2, [])


def test_every_failing_variant_is_named_with_its_message() -> None:
    variants = Variants()
    for name in ("random base_e", "nan_inf base_2", "huge_offset base_e"):
        with variants.check(name):
            assert name.endswith("base_2"), f"{name} is off"
    with pytest.raises(AssertionError) as info:
        variants.assert_all_passed()
    message = str(info.value)
    assert message.startswith("2 of 3 variants failed:")
    assert "random base_e: random base_e is off" in message
    assert "huge_offset base_e: huge_offset base_e is off" in message
    assert "nan_inf base_2" not in message


def test_a_variant_that_does_not_fail_a_check_stops_the_case() -> None:
    variants = Variants()
    with pytest.raises(RuntimeError, match="boom"), variants.check("a"):
        raise RuntimeError("boom")
    assert variants.failed == []


# -- Partials --------------------------------------------------------------------------------


def test_the_oracle_is_computed_once_and_handed_out_as_new_tensors() -> None:
    parts = make_partials(4, 3, 8, 16, torch.bfloat16, pattern="mixed", seed=3)
    for base_e in (True, False):
        first = parts.expected(1, base_e=base_e)
        again = parts.expected(1, base_e=base_e)
        assert again is not first and bit_equal(again, first)
        first.fill_(0)  # a caller's write does not reach the next caller
        direct = reference_combine_heads(*parts.head_block(1), base_e=base_e).bfloat16()
        assert bit_equal(parts.expected(1, base_e=base_e), direct)
    assert not bit_equal(parts.expected(1), parts.expected(1, base_e=False))
    assert not bit_equal(parts.expected(0), parts.expected(1))


# -- SuiteTransports, locally (a stand-in registry records what was asked) -------------------


@dataclass
class _Transport:
    group: object


@dataclass
class _Registry:
    fail_creation: bool = False
    held: dict[TransportSignature, _Transport] = field(default_factory=dict)
    calls: list[tuple[str, TransportSignature]] = field(default_factory=list)

    def get_or_create(self, signature: TransportSignature, group: object) -> _Transport:
        self.calls.append(("get_or_create", signature))
        if self.fail_creation:
            raise RuntimeError("creation failed")
        return self.held.setdefault(signature, _Transport(group))

    def get(self, signature: TransportSignature) -> _Transport | None:
        self.calls.append(("get", signature))
        return self.held.get(signature)


def _suite(**registries: Any) -> SuiteTransports:
    return SuiteTransports(registries)


def test_first_request_is_collective_later_ones_are_local() -> None:
    ag_rs, a2a = _Registry(), _Registry()
    transports = _suite(ag_rs=ag_rs, a2a=a2a)
    group = object()
    first = transports.get("ag_rs", SIG, group)  # type: ignore[arg-type]
    assert transports.get("ag_rs", SIG, group) is first  # type: ignore[arg-type]
    transports.get("ag_rs", OTHER, group)  # type: ignore[arg-type]
    transports.get("a2a", SIG, group)  # type: ignore[arg-type]
    assert ag_rs.calls == [("get_or_create", SIG), ("get", SIG), ("get_or_create", OTHER)]
    assert a2a.calls == [("get_or_create", SIG)]


def test_a_failed_creation_is_not_retried_collectively() -> None:
    registry = _Registry(fail_creation=True)
    transports = _suite(ag_rs=registry)
    with pytest.raises(RuntimeError, match="creation failed"):
        transports.get("ag_rs", SIG, object())  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="missing on this rank"):
        transports.get("ag_rs", SIG, object())  # type: ignore[arg-type]
    assert registry.calls == [("get_or_create", SIG), ("get", SIG)]


def test_a_transport_of_another_group_is_an_error() -> None:
    transports = _suite(ag_rs=_Registry())
    transports.get("ag_rs", SIG, object())  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="another process group"):
        transports.get("ag_rs", SIG, object())  # type: ignore[arg-type]


# -- SuiteTransports on a real 2-rank group ---------------------------------------------------


def _one_agreement_per_transport(rank: int, world: int, store: str) -> None:
    agreements: list[int] = []
    real = TransportRegistry._digests_agree

    def counting(*args: Any, **kwargs: Any) -> bool:
        agreements.append(1)
        return real(*args, **kwargs)

    TransportRegistry._digests_agree = counting
    try:
        with gloo_group(rank, world, store), TransportRegistry() as registry:
            transports = SuiteTransports({"ag_rs": registry})
            group = dist.group.WORLD
            assert group is not None
            first = transports.get("ag_rs", SIG, group)
            assert len(agreements) == 1 and registry.counters.creations == 1
            for _ in range(3):
                assert transports.get("ag_rs", SIG, group) is first
            assert len(agreements) == 1  # no collective on a later request
            assert registry.counters.hits == 3
    finally:
        TransportRegistry._digests_agree = real


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_later_requests_make_no_collective() -> None:
    spawn(_one_agreement_per_transport)
