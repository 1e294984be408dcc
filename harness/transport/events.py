"""What the transport registry reports to its subscribers, as values.

The capture window subscribes to a registry and turns these into `LazyEvent`s. Every
event carries `frozen`: whether it happened while the registry was frozen (inside a capture
window), so a subscriber does not have to track window state itself.
"""

from __future__ import annotations

import functools
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from harness.core.signature import TransportSignature

_THIS_PACKAGE = str(Path(__file__).resolve().parent)


@functools.cache
def _resolved(filename: str) -> str:
    """A frame's file as a real path: resolving walks every path component, and the same few
    files recur in every stack, so each is resolved once per process."""
    return str(Path(filename).resolve())


def caller_stack(skipped: tuple[str, ...], limit: int, *, named: tuple[str, ...] = ()) -> str:
    """The innermost `limit` frames of the calling stack, outermost first, as
    `traceback.format_list` writes them: without frames whose real path starts with one of
    `skipped` or whose file name as given starts with one of `named` (e.g. "<frozen importlib").

    Events are made on hot paths (every transport creation, buffer and first use), so only the
    frames kept are formatted and have their source lines looked up."""
    kept: list[tuple[FrameType, int]] = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and len(kept) < limit:
        name = frame.f_code.co_filename
        if not name.startswith(named) and not _resolved(name).startswith(skipped):
            kept.append((frame, frame.f_lineno))
        frame = frame.f_back
    kept.reverse()
    return "".join(traceback.StackSummary.extract(iter(kept)).format())


def short_stack(limit: int = 8) -> str:
    """The caller's last `limit` frames outside harness/transport/, formatted for a reviewer."""
    return caller_stack((_THIS_PACKAGE,), limit)


@dataclass(frozen=True)
class TransportCreated:
    """A transport was built for `signature` (after its buffers, before it is registered)."""

    signature: TransportSignature
    stack: str
    rank: int = 0
    backend: str = "torch"
    strategy: str = ""
    frozen: bool = False


@dataclass(frozen=True)
class BufferAllocated:
    """A buffer went through the registry's allocator (staging at creation, or anything else)."""

    signature: TransportSignature | None
    name: str
    nbytes: int
    stack: str
    rank: int = 0
    frozen: bool = False


@dataclass(frozen=True)
class RegistryMiss:
    """`get` or `get_or_create` was asked for a signature the registry does not hold."""

    signature: TransportSignature
    op: str = "get"
    stack: str = ""
    rank: int = 0
    frozen: bool = False


@dataclass(frozen=True)
class OperationFirstUse:
    """A transport ran `operation` ("gather" or "reduce") with `dtype` for the first time.

    A transport is warm for an operation and a dtype only once that operation ran with that
    dtype: b12x compiles its kernels lazily per operation and dtype, so creating the transport
    (or running its other operation) before capture is not enough.
    """

    signature: TransportSignature
    operation: str
    dtype: str
    stack: str = ""
    rank: int = 0
    frozen: bool = False


RegistryEvent = TransportCreated | BufferAllocated | RegistryMiss | OperationFirstUse


@dataclass(frozen=True)
class RegistryCounters:
    """A snapshot of what a registry has done so far (counts never go down, even on close)."""

    creations: int = 0
    buffer_allocations: int = 0
    buffer_bytes: int = 0
    misses: int = 0
    hits: int = 0
    first_uses: int = 0  # (transport, operation, dtype) run for the first time
