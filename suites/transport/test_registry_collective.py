"""The registry as a collective at 2, 4 and 16 ranks: disagreement is an error on every rank
(never a hang), and what a frozen capture window would see."""

from __future__ import annotations

import pytest
import torch

from harness.transport.errors import SignatureMismatchError
from harness.transport.events import (
    BufferAllocated,
    OperationFirstUse,
    RegistryMiss,
    TransportCreated,
)
from harness.transport.registry import TransportRegistry
from harness.transport.testing import DCP_SIZES, MODELS


@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_disagreement_raises_on_every_rank(dcp, dcp_group, world) -> None:
    group = dcp_group(dcp)
    spec = MODELS["kimi-k3"]
    mine = spec.signature("fp16" if group.rank == 0 else "bf16", dcp, world.device.type)
    with TransportRegistry(device=world.device) as registry:
        with pytest.raises(SignatureMismatchError) as info:
            registry.get_or_create(mine, group.group)
        message = str(info.value)
        assert "(fp16" in message and "(bf16" in message, message
        assert len(registry) == 0
        # Nothing was left half-done: the group agrees on the next request.
        agreed = spec.signature("bf16", dcp, world.device.type)
        assert registry.get_or_create(agreed, group.group) is registry.get(agreed)


@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_frozen_window_sees_lazy_creation_and_not_hits(dcp, dcp_group, world) -> None:
    """Warm one signature, then inside the frozen window: its use is silent, and a signature
    warmup missed shows up as a miss, its buffers and its creation, all marked frozen."""
    group = dcp_group(dcp)
    warmed = MODELS["kimi-k3"].signature("bf16", dcp, world.device.type)
    missed = MODELS["deepseek-v4"].signature("bf16", dcp, world.device.type)
    with TransportRegistry(strategy="a2a", device=world.device) as registry:
        transport = registry.get_or_create(warmed, group.group)
        q = torch.zeros(1, warmed.local_heads, warmed.query_head_dim, dtype=torch.bfloat16)
        transport.gather_queries(q.to(world.device))  # warm: the gather ran with bf16
        seen: list[object] = []
        unsubscribe = registry.subscribe(seen.append)
        with registry.frozen():
            assert registry.get_or_create(warmed, group.group) is transport
            transport.gather_queries(q.to(world.device))
            assert seen == []
            # The reduction never ran before the window: its first use is reported, frozen.
            partial = torch.zeros(1, warmed.total_heads, warmed.output_head_dim)
            lse = torch.zeros(1, warmed.total_heads)
            transport.reduce_outputs(partial.bfloat16().to(world.device), lse.to(world.device))
            (first,) = seen
            assert isinstance(first, OperationFirstUse) and first.frozen
            assert (first.operation, first.dtype, first.signature) == ("reduce", "bfloat16", warmed)
            seen.clear()
            registry.get_or_create(missed, group.group)
        unsubscribe()
        kinds = [type(e) for e in seen]
        assert kinds[0] is RegistryMiss and kinds[-1] is TransportCreated, kinds
        assert set(kinds[1:-1]) == {BufferAllocated}, kinds
        assert all(e.frozen and e.signature == missed for e in seen)
        assert registry.counters.creations == 2
