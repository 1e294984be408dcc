"""Negative controls: one deliberate piece of lazy work per detector, done inside a window.

A detector that cannot fire is a defect, so each detector has a control that provokes exactly
its kind of lazy work and nothing else. `happened()` counts that work by a means independent of
the detector (a registry counter, the c10d group counter, dynamo's frame counter, the control's
own tally), so a run with the detector removed can show the work was done and went unseen:
the control depends on that detector, and on no other.
"""

from __future__ import annotations

import contextlib
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from harness.capture.detectors import c10d_groups
from harness.core.signature import TransportSignature


@dataclass(frozen=True)
class ControlContext:
    """What a control may use: the window's registry, this rank's device, the world."""

    registry: Any
    device: torch.device
    rank: int
    world_size: int


class NegativeControl(ABC):
    """`setup` runs before the window opens, `provoke` inside the captured step."""

    detector: ClassVar[str]

    def __init__(self, context: ControlContext) -> None:
        self.context = context

    def setup(self) -> None:  # noqa: B027 - most controls need nothing before the window
        """Prepare outside the window (compile once, cache a block)."""

    @abstractmethod
    def provoke(self) -> None:
        """Do the lazy work, once."""

    @abstractmethod
    def happened(self) -> int:
        """How much of this kind of work has been done so far, counted without the detector."""


class RegistryMissControl(NegativeControl):
    """Look up a transport nobody warmed (a signature no model uses: 3 heads per rank, 5 -> 3)."""

    detector = "transport-registry"

    def unwarmed(self) -> TransportSignature:
        world = self.context.world_size
        return TransportSignature(
            dtype="bf16",
            total_heads=3 * world,
            query_head_dim=5,
            output_head_dim=3,
            dcp_world_size=world,
            max_tokens=1,
            device_type=self.context.device.type,
        )

    def provoke(self) -> None:
        found = self.context.registry.get(self.unwarmed())
        assert found is None, "the negative control's signature must never be warmed"

    def happened(self) -> int:
        return int(self.context.registry.counters.misses)


class BufferAllocationControl(NegativeControl):
    """Allocate a staging buffer through the registry's allocator."""

    detector = "transport-buffers"

    def provoke(self) -> None:
        self.context.registry.allocator.empty(
            (256,), torch.uint8, owner=None, name="negative-control"
        )

    def happened(self) -> int:
        return int(self.context.registry.counters.buffer_allocations)


class NewGroupControl(NegativeControl):
    """Create a process group: this rank alone, with local synchronization (no collective, so
    the control stays cheap at 16 ranks and cannot desynchronize the world)."""

    detector = "process-groups"

    def provoke(self) -> None:
        dist.new_group(ranks=[self.context.rank], use_local_synchronization=True)

    def happened(self) -> int:
        return sum(c10d_groups())


_fresh_ids = itertools.count()


class DynamoRecompileControl(NegativeControl):
    """Call a torch.compile'd function (compiled before the window) with a new shape: a
    recompile. Each control compiles its own fresh function, so dynamo's cache of one control
    (and its recompile limit) never decides another's outcome."""

    detector = "dynamo"

    def setup(self) -> None:
        namespace: dict[str, Any] = {}
        name = f"<dcpqual-dynamo-control-{next(_fresh_ids)}>"
        exec(compile("def control(x):\n    return x * 2 + 1\n", name, "exec"), namespace)
        control: Callable[[torch.Tensor], torch.Tensor] = namespace["control"]
        self._fn = torch.compile(control, backend="eager", dynamic=False)
        self._size = 2
        self._fn(torch.ones(self._size))

    def provoke(self) -> None:
        self._size += 1
        self._fn(torch.ones(self._size))

    def happened(self) -> int:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["total"])


class CudaMemoryControl(NegativeControl):
    """Keep a tensor allocated in the default pool during capture, on a stream that is not
    capturing, from a block cached before the window (so no cudaMalloc is needed)."""

    detector = "cuda-memory"
    NBYTES = 4 << 20

    def setup(self) -> None:
        self._stream = torch.cuda.Stream(device=self.context.device)
        self.kept: list[torch.Tensor] = []
        with torch.cuda.stream(self._stream):
            block = torch.empty(self.NBYTES, dtype=torch.uint8, device=self.context.device)
            del block

    def provoke(self) -> None:
        with torch.cuda.stream(self._stream):
            self.kept.append(
                torch.empty(self.NBYTES, dtype=torch.uint8, device=self.context.device)
            )

    def happened(self) -> int:
        return len(self.kept)


class TritonJitControl(NegativeControl):
    """Launch a tiny Triton kernel with a block size it was never compiled for."""

    detector = "triton-jit"

    def setup(self) -> None:
        import triton
        import triton.language as tl

        jit: Callable[[Callable[..., None]], Any] = triton.jit  # triton ships no type hints

        @jit
        def fill(out_ptr: Any, value: float, BLOCK: tl.constexpr) -> None:
            offsets = tl.arange(0, BLOCK)
            tl.store(out_ptr + offsets, value)

        self._kernel = fill
        self._out = torch.zeros(4096, device=self.context.device)
        self._block = 8
        self._launches = 0

    def provoke(self) -> None:
        self._block *= 2
        self._kernel[(1,)](self._out, 1.0, BLOCK=self._block)
        self._launches += 1

    def happened(self) -> int:
        return self._launches


class B12xResolutionControl(NegativeControl):
    """Ask b12x to resolve a kernel: its own check, the call every b12x kernel resolution
    makes, refuses while a kernel-resolution guard is held (the refusal is caught here so the
    step goes on)."""

    detector = "b12x-kernel-resolution"

    def setup(self) -> None:
        import b12x._lib.runtime_control as runtime_control

        self._rc = runtime_control
        self._attempts = 0

    def provoke(self) -> None:
        self._attempts += 1
        with contextlib.suppress(self._rc.KernelResolutionFrozenError):
            self._rc.raise_if_kernel_resolution_frozen(
                "dcpqual negative control", cache_key=("dcpqual", self._attempts)
            )

    def happened(self) -> int:
        return self._attempts


CONTROLS: dict[str, type[NegativeControl]] = {
    control.detector: control
    for control in (
        RegistryMissControl,
        BufferAllocationControl,
        NewGroupControl,
        DynamoRecompileControl,
        CudaMemoryControl,
        TritonJitControl,
        B12xResolutionControl,
    )
}
