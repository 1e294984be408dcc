"""Detectors that need a GPU (or a GPU library): device memory growth, Triton JIT, b12x.

On a CPU-only machine each one reports why it cannot run (`unavailable_reason`), and the window
lists that reason in the record for the evidence's `limitations`. The libraries are reached
through injectable objects (`cuda`, `knobs`, `runtime_control`) so the unit tests drive every
code path with fakes, and a compat test drives the Triton and b12x ones against the real
packages.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from harness.capture.detector import Detector, GraphPool
from harness.capture.events import LazyEvent

# -- device memory --------------------------------------------------------------------------

DEFAULT_POOL = (0, 0)
MIB = 1 << 20
# Without a b12x transport to size it by: room for an executable graph, below an NCCL
# communicator's buffers.
DEFAULT_DRIVER_TOLERANCE = 16 * MIB


def driver_floor(slabs: Iterable[int]) -> int:
    """The driver-level growth the memory detector tolerates: just under the smallest b12x IPC
    slab the run's transports would allocate (one lazily created channel is then always seen;
    a fixed 16 MiB would miss a production channel of 2,041,856 B), else the default."""
    sizes = [int(n) for n in slabs if int(n) > 0]
    return min(sizes) - 1 if sizes else DEFAULT_DRIVER_TOLERANCE


@dataclass(frozen=True)
class MemoryReading:
    """One look at device memory, split the way lazy work shows up.

    `allocated_outside_graph`: bytes PyTorch's caching allocator has handed out in every pool
    except the captured graph's private pool (whose tensors belong to the graph).
    `reserved`: what the caching allocator holds from the driver, all pools.
    `device_used`: total minus free, as the driver sees it (cudaMemGetInfo), which includes what
    libraries allocate around PyTorch (b12x's IPC slab, NCCL communicator buffers).
    """

    allocated_outside_graph: int
    reserved: int
    device_used: int


def read_memory(
    cuda: Any, device: torch.device, graph_pool: tuple[int, int] | None = None
) -> MemoryReading:
    """Read `cuda.memory_snapshot()`, `cuda.memory_stats()` and `cuda.mem_get_info()`."""
    index = device.index if device.index is not None else cuda.current_device()
    snapshot = cuda.memory_snapshot()
    segments = snapshot.get("segments", []) if isinstance(snapshot, Mapping) else snapshot
    outside = 0
    for segment in segments:
        if segment.get("device", index) != index:
            continue
        pool = tuple(segment.get("segment_pool_id", DEFAULT_POOL))
        if graph_pool is not None and pool == tuple(graph_pool):
            continue
        outside += int(segment.get("allocated_size", 0))
    stats = cuda.memory_stats(device)
    free, total = cuda.mem_get_info(device)
    return MemoryReading(
        allocated_outside_graph=outside,
        reserved=int(stats.get("reserved_bytes.all.current", 0)),
        device_used=int(total) - int(free),
    )


def memory_growth(
    before: MemoryReading,
    after: MemoryReading,
    *,
    tolerance_bytes: int = 0,
    driver_tolerance_bytes: int = DEFAULT_DRIVER_TOLERANCE,
) -> list[str]:
    """What grew across the capture that the graph does not own; one message per finding.

    The driver-level tolerance leaves room for the executable graph itself (instantiation takes
    device memory outside PyTorch's allocator); `driver_floor` puts it under the smallest b12x
    slab of the run, and NCCL communicators are far larger.
    """
    findings = []
    held = after.allocated_outside_graph - before.allocated_outside_graph
    if held > tolerance_bytes:
        findings.append(
            f"PyTorch's allocator holds {held} more bytes outside the graph's private pool "
            "after capture (memory_stats/memory_snapshot)"
        )
    outside = (after.device_used - before.device_used) - (after.reserved - before.reserved)
    if outside > driver_tolerance_bytes:
        findings.append(
            f"device memory grew by {outside} bytes outside PyTorch's caching allocator "
            "(an IPC slab, communicator buffers or library workspace allocated during capture)"
        )
    return findings


class CudaMemoryDetector(Detector):
    """Device memory growth across the capture, CUDA only.

    The baseline is taken when the capture begins, after the window's warm-up iterations: those
    run on the capture's side stream precisely so that allocator and library first-use settles
    before capture, as PyTorch's CUDA graph documentation requires. Lazy transport staging
    allocated through the registry lands in the graph's private pool, which this detector leaves
    to the graph; `transport-buffers` reports it on both paths.
    """

    name = "cuda-memory"

    def __init__(
        self,
        device: torch.device | str | None = None,
        *,
        cuda: Any = None,
        tolerance_bytes: int = 0,
        driver_tolerance_bytes: int = DEFAULT_DRIVER_TOLERANCE,
    ) -> None:
        super().__init__()
        self._cuda = torch.cuda if cuda is None else cuda
        self._device = None if device is None else torch.device(device)
        self.tolerance_bytes = tolerance_bytes
        self.driver_tolerance_bytes = driver_tolerance_bytes
        self._graph_pool: tuple[int, int] | None = None
        self._baseline: MemoryReading | None = None

    def unavailable_reason(self) -> str | None:
        if not self._cuda.is_available():
            return (
                f"CUDA is not available (torch {torch.__version__}): device memory growth "
                "cannot be measured; on CPU transport-buffers stands in for it"
            )
        if self._device is not None and self._device.type != "cuda":
            return f"the window runs on {self._device}, not on a CUDA device"
        return None

    @property
    def device(self) -> torch.device:
        if self._device is None:
            return torch.device("cuda", self._cuda.current_device())
        return self._device

    def _install(self) -> None:
        self._graph_pool = None
        self._baseline = read_memory(self._cuda, self.device)

    def enter_phase(self, phase: str) -> None:
        super().enter_phase(phase)
        if phase == "capture" and self.running:
            self._baseline = read_memory(self._cuda, self.device)

    def note_graph_pool(self, pool: GraphPool) -> None:
        self._graph_pool = pool

    def _uninstall(self) -> None:
        self._baseline = None

    def _collect(self) -> None:
        assert self._baseline is not None, "stop() without start()"
        after = read_memory(self._cuda, self.device, self._graph_pool)
        for finding in memory_growth(
            self._baseline,
            after,
            tolerance_bytes=self.tolerance_bytes,
            driver_tolerance_bytes=self.driver_tolerance_bytes,
        ):
            self.report(finding, stack="")


# -- Triton JIT -----------------------------------------------------------------------------


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def _installed(package: str) -> bool:
    """Whether `package` can be found, without importing it."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a broken parent, or a module without a spec
        return False


class TritonJitDetector(Detector):
    """A Triton kernel JIT-compiled while the window is open.

    Installs `triton.knobs.runtime.jit_post_compile_hook` (chaining any hook already there) and
    puts the previous one back at stop. Triton calls it after every compile, with keyword
    arguments `key`, `repr`, `fn`, `compile`, `is_manual_warmup`, `already_compiled`.
    """

    name = "triton-jit"

    def __init__(
        self, knobs: Any = None, *, cuda_available: Callable[[], bool] = _cuda_available
    ) -> None:
        super().__init__()
        self._knobs = knobs
        self._cuda_available = cuda_available
        self._previous: Any = None

    def _load(self) -> Any:
        if self._knobs is None:
            from triton import knobs

            self._knobs = knobs
        return self._knobs

    def unavailable_reason(self) -> str | None:
        # CUDA first: without it no kernel can compile, and importing triton only to say so
        # maps its 70-80 MB native library into every CPU rank.
        if not self._cuda_available():
            installed = self._knobs is not None or _installed("triton")
            return (
                f"CUDA is not available (triton {'installed' if installed else 'not installed'}"
                ", not imported): no Triton kernel can be JIT-compiled here, so its hook cannot"
                " fire"
            )
        try:
            knobs = self._load()
        except Exception as exc:  # not installed, or broken at import
            return f"triton is not importable ({type(exc).__name__}: {exc})"
        if not hasattr(getattr(knobs, "runtime", None), "jit_post_compile_hook"):
            return "this triton has no knobs.runtime.jit_post_compile_hook"
        return None

    def _install(self) -> None:
        runtime = self._load().runtime
        self._previous = runtime.jit_post_compile_hook
        runtime.jit_post_compile_hook = self._hook

    def _uninstall(self) -> None:
        runtime = self._load().runtime
        if runtime.jit_post_compile_hook == self._hook:  # bound methods: equal, never identical
            runtime.jit_post_compile_hook = self._previous
        self._previous = None

    def _hook(self, **kwargs: Any) -> Any:
        what = kwargs.get("repr") or kwargs.get("key") or "a kernel"
        self.report(f"Triton JIT compile of {what} inside the capture window")
        return self._previous(**kwargs) if self._previous is not None else None


# -- b12x kernel resolution -----------------------------------------------------------------

B12X_GUARD_REASON = "dcpqual capture window"
_REPORTED = "__dcpqual_reported__"
# b12x 1.5.1 `preparation.session.prepare_default` refuses an unprepared plan with a plain
# RuntimeError, not KernelResolutionFrozenError, under a frozen session and during capture.
B12X_UNPREPARED_PLAN = re.compile(
    r"plan is not prepared and kernel resolution is frozen"
    r"|plan .* is not prepared; a shape used under CUDA graph capture must be declared"
)


def _unreported_refusal(exc: BaseException, frozen_error: type[BaseException]) -> bool:
    """A b12x refusal to resolve or prepare lazily that no report has named yet."""
    if getattr(exc, _REPORTED, False):
        return False
    if isinstance(exc, frozen_error):
        return True
    return type(exc) is RuntimeError and bool(B12X_UNPREPARED_PLAN.search(str(exc)))


class B12xKernelResolutionDetector(Detector):
    """b12x resolving (compiling, loading) a kernel while the window is open.

    b12x 1.5.1 has no `freeze_kernel_resolution`; its freeze is the context manager
    `b12x._lib.runtime_control.kernel_resolution_guard(reason)`, the one its own
    `PreparationSession.capture()` and `.freeze()` hold. While any guard is held, every kernel
    resolution point (CuTe compile, Triton JIT miss, planned object loads) calls
    `raise_if_kernel_resolution_frozen(kind, target=, cache_key=)`, which raises
    `KernelResolutionFrozenError`. The detector holds a guard for the window and reports each
    refusal: live where b12x looks that function up at call time (the module attribute is
    wrapped), and through `explain` for call sites that bound it at import.
    """

    name = "b12x-kernel-resolution"

    def __init__(
        self,
        runtime_control: ModuleType | Any = None,
        *,
        cuda_available: Callable[[], bool] = _cuda_available,
    ) -> None:
        super().__init__()
        self._rc = runtime_control
        self._cuda_available = cuda_available
        self._guard: Any = None
        self._original: Any = None

    def _load(self) -> Any:
        if self._rc is None:
            import b12x._lib.runtime_control as runtime_control

            self._rc = runtime_control
        return self._rc

    def unavailable_reason(self) -> str | None:
        try:
            rc = self._load()
        except Exception as exc:
            return f"b12x is not importable ({type(exc).__name__}: {exc})"
        for attr in (
            "kernel_resolution_guard",
            "raise_if_kernel_resolution_frozen",
            "KernelResolutionFrozenError",
        ):
            if not hasattr(rc, attr):
                return f"b12x has no {attr} in b12x._lib.runtime_control"
        if not self._cuda_available():
            return (
                "b12x is importable but CUDA is not available: b12x resolves kernels only "
                "for sm_12x GPUs, so its kernel-resolution guard cannot fire here"
            )
        return None

    def _install(self) -> None:
        rc = self._load()
        self._guard = rc.kernel_resolution_guard(B12X_GUARD_REASON)
        self._guard.__enter__()
        self._original = rc.raise_if_kernel_resolution_frozen
        rc.raise_if_kernel_resolution_frozen = self._checked

    def _uninstall(self) -> None:
        rc = self._load()
        if self._original is not None and rc.raise_if_kernel_resolution_frozen == self._checked:
            rc.raise_if_kernel_resolution_frozen = self._original
        self._original = None
        if self._guard is not None:
            guard, self._guard = self._guard, None
            guard.__exit__(None, None, None)

    def _checked(self, kind: str, *, target: object = None, cache_key: object = None) -> None:
        try:
            self._original(kind, target=target, cache_key=cache_key)
        except self._load().KernelResolutionFrozenError as exc:
            setattr(exc, _REPORTED, True)
            self.report(f"b12x refused a kernel resolution inside the capture window: {exc}")
            raise

    def explain(self, exc: BaseException) -> LazyEvent | None:
        frozen_error = self._load().KernelResolutionFrozenError
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            if _unreported_refusal(current, frozen_error):
                setattr(current, _REPORTED, True)
                return self.report(
                    f"b12x refused a kernel resolution inside the capture window: {current}",
                    stack="",
                )
            current = current.__cause__ or current.__context__
        return None
