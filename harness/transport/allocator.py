"""The registry's buffer allocator: every transport buffer is born here, so it can be counted.

On GPU, memory growth during capture is seen through `torch.cuda.memory_stats()`; on CPU there
is no such counter, so the simulation counts what goes through this allocator instead. A
transport that allocated behind its back would be invisible to the capture window, which is why
transports take an allocator instead of calling `torch.empty` for their staging.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from harness.core.signature import TransportSignature
from harness.transport.events import BufferAllocated, short_stack


@runtime_checkable
class Allocator(Protocol):
    """What a transport needs to allocate its staging: `registry.allocator` satisfies it."""

    device: torch.device

    def empty(
        self,
        shape: Sequence[int],
        dtype: torch.dtype,
        *,
        owner: TransportSignature | None,
        name: str,
    ) -> torch.Tensor: ...

    def record_external(self, nbytes: int, *, owner: TransportSignature | None, name: str) -> None:
        """Count memory a library allocated itself (b12x's IPC slab)."""
        ...


@dataclass(frozen=True)
class BufferRecord:
    """One allocation: who asked, for what, how big."""

    owner: TransportSignature | None
    name: str
    nbytes: int
    shape: tuple[int, ...]
    dtype: str


class CountingAllocator:
    """Allocates on one device, keeps a record per buffer, and reports each one to `on_allocate`.

    `on_allocate` is the registry's hook; an exception it raises (a subscriber stopping a lazy
    allocation inside a capture window) propagates to the caller and the buffer is dropped.
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        on_allocate: Callable[[BufferAllocated], None] | None = None,
        *,
        rank: Callable[[], int] = lambda: 0,
        frozen: Callable[[], bool] = lambda: False,
    ) -> None:
        self.device = torch.device(device)
        self._on_allocate = on_allocate
        self._rank = rank
        self._frozen = frozen
        self._records: list[BufferRecord] = []

    @property
    def records(self) -> tuple[BufferRecord, ...]:
        return tuple(self._records)

    @property
    def allocations(self) -> int:
        return len(self._records)

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self._records)

    def empty(
        self,
        shape: Sequence[int],
        dtype: torch.dtype,
        *,
        owner: TransportSignature | None,
        name: str,
    ) -> torch.Tensor:
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"buffer {name!r} has a negative dimension: {shape}")
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        self._note(owner, name, nbytes, shape, str(dtype).removeprefix("torch."))
        return torch.empty(shape, dtype=dtype, device=self.device)

    def record_external(self, nbytes: int, *, owner: TransportSignature | None, name: str) -> None:
        if nbytes < 0:
            raise ValueError(f"external buffer {name!r} has negative size {nbytes}")
        self._note(owner, name, int(nbytes), (int(nbytes),), "external")

    def _note(
        self,
        owner: TransportSignature | None,
        name: str,
        nbytes: int,
        shape: tuple[int, ...],
        dtype: str,
    ) -> None:
        if self._on_allocate is not None:
            self._on_allocate(
                BufferAllocated(
                    signature=owner,
                    name=name,
                    nbytes=nbytes,
                    stack=short_stack(),
                    rank=self._rank(),
                    frozen=self._frozen(),
                )
            )
        self._records.append(BufferRecord(owner, name, nbytes, shape, dtype))
