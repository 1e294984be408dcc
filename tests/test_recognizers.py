"""Recognizers, one layer at a time: which attributes each reads, and what an absent or unset
one means (real vLLM layers do not all carry every attribute the fork's layers do)."""

from __future__ import annotations

import pytest
from _support.layers import generic_layer, kimi_layer
from torch import nn

from harness.errors import UsageError
from harness.models.backends import B12XMLABackend, FlashMLABackend
from harness.warm.recognizers import (
    WarmContext,
    backend_name,
    recognize_generic_mla,
    recognize_kimi_k3,
    recognizer_set,
)

CONTEXT = WarmContext(dcp_world_size=16)


class _ImplWithoutDCP:
    """A backend impl that never set `dcp_world_size`."""


# -- backend_name ----------------------------------------------------------------------------


def test_the_backend_is_read_from_attn_backend_when_the_layer_has_no_getter() -> None:
    layer = nn.Module()
    layer.attn_backend = B12XMLABackend
    assert backend_name(layer) == "B12X_MLA"


def test_the_getter_wins_over_the_attn_backend_attribute() -> None:
    layer = kimi_layer()
    layer.get_attn_backend = lambda: FlashMLABackend
    assert backend_name(layer) == "FLASHMLA"
    assert recognize_kimi_k3(layer, CONTEXT) is None


# -- generic MLA: the dcp_b12x gate and the impl's DCP size ----------------------------------


def test_generic_mla_inside_the_gate_is_local_heads_times_dcp() -> None:
    layer = generic_layer()
    assert layer.dcp_b12x
    sig = recognize_generic_mla(layer, WarmContext(dcp_world_size=8))
    assert sig is not None
    assert (sig.total_heads, sig.query_head_dim, sig.output_head_dim) == (128, 576, 512)
    assert sig.dcp_world_size == 8


def test_a_generic_mla_layer_without_the_gate_attribute_is_not_warmed() -> None:
    """Upstream vLLM's `MLAAttention` has no `dcp_b12x`: absent means closed, never an error."""
    layer = generic_layer()
    del layer.dcp_b12x
    assert recognize_generic_mla(layer, CONTEXT) is None


def test_generic_mla_at_dcp1_is_not_warmed_even_with_the_gate_open() -> None:
    layer = generic_layer()
    layer.impl.dcp_world_size = 1
    assert layer.dcp_b12x
    assert recognize_generic_mla(layer, CONTEXT) is None


@pytest.mark.parametrize("impl", ["absent", "without dcp_world_size", None, 0])
def test_an_impl_that_does_not_say_its_dcp_size_counts_as_dcp1(impl: object) -> None:
    """vLLM treats an impl's unset DCP size as 1: nothing to warm, and no error."""
    layer = generic_layer()
    if impl == "absent":
        del layer.impl
    elif impl == "without dcp_world_size":
        layer.impl = _ImplWithoutDCP()
    else:
        layer.impl.dcp_world_size = impl
    assert recognize_generic_mla(layer, CONTEXT) is None


# -- Kimi-K3: the layer's own DCP size, else the impl's --------------------------------------


@pytest.mark.parametrize("own", ["absent", 0, None])
def test_kimi_falls_back_to_the_impl_dcp_size_when_the_layer_has_none(own: object) -> None:
    layer = kimi_layer()
    if own == "absent":
        del layer.dcp_world_size
    else:
        layer.dcp_world_size = own
    sig = recognize_kimi_k3(layer, CONTEXT)
    assert sig is not None
    assert (sig.total_heads, sig.local_heads, sig.dcp_world_size) == (96, 6, 16)


def test_kimi_with_neither_dcp_size_is_not_warmed() -> None:
    layer = kimi_layer()
    del layer.dcp_world_size
    del layer.impl
    assert recognize_kimi_k3(layer, CONTEXT) is None


# -- recognizer sets -------------------------------------------------------------------------


def test_an_unknown_recognizer_set_names_the_known_ones() -> None:
    with pytest.raises(UsageError) as raised:
        recognizer_set("after-kimi")
    assert str(raised.value) == (
        "unknown recognizer set 'after-kimi'; expected one of vendored, before-kimi"
    )
