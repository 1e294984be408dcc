"""One rank asks the transport registry for another signature than its peers.

`TransportRegistry.get_or_create` is collective: every rank must raise `SignatureMismatchError`
(naming both signatures) instead of hanging in the creation collectives.
"""

from __future__ import annotations

import torch.distributed as dist
from _world import all_reduce_sum, fault_rank, rank

from harness.core.signature import TransportSignature
from harness.transport.registry import TransportRegistry


def test_before():
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_fault():
    dtype = "fp16" if rank() == fault_rank() else "bf16"
    world = dist.get_world_size()
    signature = TransportSignature(dtype, 2 * world, 24, 16, world, max_tokens=4)
    TransportRegistry().get_or_create(signature)


def test_after():
    dist.barrier()
