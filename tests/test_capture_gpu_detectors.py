"""The GPU detectors without a GPU: each says why it cannot run on CPU torch, and each fires
when driven through fakes shaped like the real APIs (`torch.cuda` memory calls, Triton's
`knobs.runtime`, b12x's `runtime_control`). `test_capture_compat.py` checks the real Triton and
b12x where they are installed."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from harness.capture.check import memory_floor
from harness.capture.events import LazyEvent, LazySpecializationError
from harness.capture.gpu_detectors import (
    DEFAULT_DRIVER_TOLERANCE,
    MIB,
    B12xKernelResolutionDetector,
    CudaMemoryDetector,
    MemoryReading,
    TritonJitDetector,
    driver_floor,
    memory_growth,
    read_memory,
)
from harness.core.signature import TransportSignature
from harness.transport.b12x_backend import slab_bytes

GRAPH_POOL = (1, 7)


def _raise(event: LazyEvent) -> None:
    raise LazySpecializationError(event)


# -- CUDA memory ------------------------------------------------------------------------------


class FakeCuda:
    """`torch.cuda`'s memory API, with segments and driver usage a test moves by hand."""

    def __init__(self) -> None:
        self.segments: list[dict[str, Any]] = []
        self.reserved = 0
        self.used = 0

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def memory_snapshot(self) -> dict[str, Any]:
        return {"segments": list(self.segments), "device_traces": []}

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        return {"reserved_bytes.all.current": self.reserved}

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return (80 * 1024 * MIB - self.used, 80 * 1024 * MIB)

    def allocate(self, nbytes: int, pool: tuple[int, int] = (0, 0), device: int = 0) -> None:
        self.segments.append(
            {"device": device, "segment_pool_id": pool, "allocated_size": nbytes,
             "total_size": nbytes}
        )  # fmt: skip
        self.reserved += nbytes
        self.used += nbytes


def test_memory_detector_on_cpu_torch_says_why() -> None:
    status = CudaMemoryDetector().status()
    assert not status.active and "CUDA is not available" in status.reason
    on_cpu = CudaMemoryDetector("cpu", cuda=FakeCuda()).status()
    assert not on_cpu.active and "not on a CUDA device" in on_cpu.reason


def test_read_memory_leaves_the_graph_pool_and_other_devices_out() -> None:
    cuda = FakeCuda()
    cuda.allocate(100)
    cuda.allocate(1000, pool=GRAPH_POOL)
    cuda.allocate(10_000, device=1)
    reading = read_memory(cuda, torch.device("cuda", 0), GRAPH_POOL)
    assert reading.allocated_outside_graph == 100
    assert read_memory(cuda, torch.device("cuda", 0)).allocated_outside_graph == 1100


def test_memory_growth_findings() -> None:
    before = MemoryReading(allocated_outside_graph=0, reserved=0, device_used=0)
    assert memory_growth(before, before) == []
    held = MemoryReading(allocated_outside_graph=512, reserved=2 * MIB, device_used=2 * MIB)
    [finding] = memory_growth(before, held)
    assert "512 more bytes outside the graph's private pool" in finding
    assert memory_growth(before, held, tolerance_bytes=512) == []
    slab = MemoryReading(allocated_outside_graph=0, reserved=0, device_used=64 * MIB)
    [finding] = memory_growth(before, slab)
    assert f"{64 * MIB} bytes outside PyTorch's caching allocator" in finding
    graph_exec = MemoryReading(allocated_outside_graph=0, reserved=0, device_used=MIB)
    assert memory_growth(before, graph_exec) == []


def _capture(detector: CudaMemoryDetector, cuda: FakeCuda, *, lazy: int = 0) -> None:
    detector.start()
    cuda.allocate(3 * MIB)  # warm-up iterations' first use: before the baseline
    detector.enter_phase("capture")
    cuda.allocate(5 * MIB, pool=GRAPH_POOL)  # the graph's own tensors
    if lazy:
        cuda.allocate(lazy)  # kept in the default pool across capture
    detector.note_graph_pool(GRAPH_POOL)
    detector.stop()


def test_memory_detector_ignores_warmup_and_the_graphs_own_pool() -> None:
    cuda = FakeCuda()
    detector = CudaMemoryDetector("cuda:0", cuda=cuda)
    _capture(detector, cuda)
    assert detector.events == []


def test_memory_detector_reports_growth_outside_the_graph() -> None:
    cuda = FakeCuda()
    detector = CudaMemoryDetector("cuda:0", cuda=cuda)
    _capture(detector, cuda, lazy=MIB)
    [event] = detector.events
    assert event.detector == "cuda-memory" and event.phase == "capture"
    assert f"{MIB} more bytes" in event.what


def test_memory_detector_strict_raises_at_stop() -> None:
    cuda = FakeCuda()
    detector = CudaMemoryDetector("cuda:0", cuda=cuda)
    detector.start(_raise)
    detector.enter_phase("capture")
    cuda.used += 100 * MIB  # a library's cudaMalloc, invisible to PyTorch's allocator
    with pytest.raises(LazySpecializationError, match="outside PyTorch's caching allocator"):
        detector.stop()
    assert not detector.running


# -- Triton -----------------------------------------------------------------------------------


def _knobs(previous: Any = None) -> SimpleNamespace:
    return SimpleNamespace(runtime=SimpleNamespace(jit_post_compile_hook=previous))


def _triton_compiles(knobs: SimpleNamespace, name: str) -> Any:
    """What Triton's JITFunction._do_compile does after a compile (keyword-only call)."""
    hook = knobs.runtime.jit_post_compile_hook
    if not hook:
        return None
    return hook(key=name, repr=f"{name}[num_warps=4]", fn=None, compile={"key": name},
                is_manual_warmup=False, already_compiled=False)  # fmt: skip


def test_triton_detector_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    no_cuda = TritonJitDetector(_knobs(), cuda_available=lambda: False).status()
    assert not no_cuda.active and "CUDA is not available (triton installed" in no_cuda.reason
    old = TritonJitDetector(SimpleNamespace(runtime=SimpleNamespace()), cuda_available=lambda: True)
    assert "no knobs.runtime.jit_post_compile_hook" in old.status().reason
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    missing = TritonJitDetector(cuda_available=lambda: True).status()
    assert not missing.active and "triton is not importable (ModuleNotFoundError" in missing.reason
    absent = TritonJitDetector(cuda_available=lambda: False).status()
    assert "CUDA is not available (triton not installed" in absent.reason


class _FakeTriton(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves an importable `triton` and records every time its module is executed."""

    def __init__(self) -> None:
        self.executed: list[str] = []

    def find_spec(self, name: str, path: object = None, target: object = None) -> Any:
        if name.partition(".")[0] != "triton":
            return None
        return importlib.util.spec_from_loader(name, self, is_package=True)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        self.executed.append(module.__name__)
        setattr(module, "knobs", _knobs())  # noqa: B010


def test_triton_detector_on_a_cpu_rank_says_why_without_importing_triton(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Importing triton maps its large native library into the process: a rank without CUDA,
    where no kernel can compile, must not pay that for a detector that cannot run."""
    fake = _FakeTriton()
    real = {m: sys.modules.pop(m) for m in list(sys.modules) if m.partition(".")[0] == "triton"}
    monkeypatch.setattr(sys, "meta_path", [fake, *sys.meta_path])
    try:
        status = TritonJitDetector(cuda_available=lambda: False).status()
        assert not status.active and "CUDA is not available (triton installed" in status.reason
        assert fake.executed == [] and "triton" not in sys.modules
        # With CUDA the same detector does import it, and becomes active.
        assert TritonJitDetector(cuda_available=lambda: True).status().active
        assert fake.executed == ["triton"]
    finally:  # the fake must not outlive the test; the real modules come back
        for name in [m for m in sys.modules if m.partition(".")[0] == "triton"]:
            del sys.modules[name]
        sys.modules.update(real)


def test_triton_hook_reports_compiles_and_chains_the_previous_hook() -> None:
    chained: list[str] = []

    def previous(**kwargs: Any) -> str:
        chained.append(kwargs["key"])
        return "kept"

    knobs = _knobs(previous)
    detector = TritonJitDetector(knobs, cuda_available=lambda: True)
    detector.start()
    assert _triton_compiles(knobs, "fill_kernel") == "kept"
    detector.stop()
    assert knobs.runtime.jit_post_compile_hook is previous
    _triton_compiles(knobs, "after_window")
    [event] = detector.events
    assert "Triton JIT compile of fill_kernel[num_warps=4]" in event.what
    assert chained == ["fill_kernel", "after_window"]


def test_triton_hook_raises_in_strict_mode() -> None:
    knobs = _knobs()
    detector = TritonJitDetector(knobs, cuda_available=lambda: True)
    detector.start(_raise)
    with pytest.raises(LazySpecializationError, match="fill_kernel"):
        _triton_compiles(knobs, "fill_kernel")
    detector.stop()
    assert knobs.runtime.jit_post_compile_hook is None


# -- b12x -------------------------------------------------------------------------------------


class FrozenError(RuntimeError):
    pass


def _fake_runtime_control() -> SimpleNamespace:
    """b12x 1.5.1's `b12x._lib.runtime_control`, reduced to the same behaviour."""
    guards: list[str | None] = []

    @contextlib.contextmanager
    def kernel_resolution_guard(reason: str | None = None) -> Iterator[None]:
        guards.append(reason)
        try:
            yield
        finally:
            guards.remove(reason)

    def raise_if_kernel_resolution_frozen(kind: str, *, target=None, cache_key=None) -> None:
        if guards:
            raise FrozenError(f"b12x kernel resolution is frozen; refusing {kind}")

    return SimpleNamespace(
        guards=guards,
        kernel_resolution_guard=kernel_resolution_guard,
        raise_if_kernel_resolution_frozen=raise_if_kernel_resolution_frozen,
        KernelResolutionFrozenError=FrozenError,
    )


def test_b12x_detector_reasons() -> None:
    try:
        import b12x  # noqa: F401
    except ImportError:
        assert "b12x is not importable" in B12xKernelResolutionDetector().status().reason
    no_cuda = B12xKernelResolutionDetector(_fake_runtime_control(), cuda_available=lambda: False)
    assert "CUDA is not available" in no_cuda.status().reason
    bare = B12xKernelResolutionDetector(SimpleNamespace(), cuda_available=lambda: True)
    assert "no kernel_resolution_guard" in bare.status().reason


def test_b12x_guard_is_held_only_while_the_window_is_open() -> None:
    rc = _fake_runtime_control()
    original = rc.raise_if_kernel_resolution_frozen
    detector = B12xKernelResolutionDetector(rc, cuda_available=lambda: True)
    detector.start()
    assert rc.guards == ["dcpqual capture window"]
    with pytest.raises(FrozenError):  # record mode: b12x still refuses, the event is kept
        rc.raise_if_kernel_resolution_frozen("cute.compile", cache_key=1)
    detector.stop()
    assert rc.guards == [] and rc.raise_if_kernel_resolution_frozen is original
    rc.raise_if_kernel_resolution_frozen("cute.compile")  # unfrozen again
    [event] = detector.events
    assert "refusing cute.compile" in event.what


def test_b12x_refusal_from_a_bound_call_site_is_explained() -> None:
    rc = _fake_runtime_control()
    bound = rc.raise_if_kernel_resolution_frozen  # `from ... import` at b12x import time
    detector = B12xKernelResolutionDetector(rc, cuda_available=lambda: True)
    detector.start()
    with pytest.raises(FrozenError) as info:
        bound("Triton JIT miss")
    assert detector.events == []
    wrapped = RuntimeError("capture failed")
    wrapped.__cause__ = info.value
    event = detector.explain(wrapped)
    assert event is not None and "refusing Triton JIT miss" in event.what
    assert detector.explain(wrapped) is None  # reported once
    assert detector.explain(ValueError("unrelated")) is None
    detector.stop()


def test_b12x_strict_raises_at_the_refusal() -> None:
    rc = _fake_runtime_control()
    detector = B12xKernelResolutionDetector(rc, cuda_available=lambda: True)
    detector.start(_raise)
    with pytest.raises(LazySpecializationError, match=r"refusing cute\.compile") as info:
        rc.raise_if_kernel_resolution_frozen("cute.compile")
    assert isinstance(info.value.__context__, FrozenError)
    detector.stop()
    assert rc.guards == []


# -- the memory floor, sized by the run's b12x slabs -----------------------------------------

KIMI_CUDA = TransportSignature("bf16", 96, 576, 512, 16, max_tokens=8, device_type="cuda")


def test_the_floor_is_just_under_the_smallest_b12x_slab_of_the_run() -> None:
    small = TransportSignature("bf16", 8, 24, 16, 2, max_tokens=4, device_type="cuda")
    b12x = SimpleNamespace(backend="b12x", signatures=lambda: (KIMI_CUDA, small))
    assert memory_floor(b12x) == min(slab_bytes(KIMI_CUDA), slab_bytes(small)) - 1
    one = SimpleNamespace(backend="b12x", signatures=lambda: (KIMI_CUDA,))
    assert memory_floor(one) == 2_041_856 - 1  # 96 heads x 576, 8 tokens (fork.md, b12x 1.5.1)
    torch_registry = SimpleNamespace(backend="torch", signatures=lambda: (KIMI_CUDA,))
    assert memory_floor(torch_registry) == DEFAULT_DRIVER_TOLERANCE == driver_floor(())


def _lazy_slab(tolerance: int) -> list[LazyEvent]:
    cuda = FakeCuda()
    detector = CudaMemoryDetector("cuda:0", cuda=cuda, driver_tolerance_bytes=tolerance)
    detector.start()
    detector.enter_phase("capture")
    cuda.used += slab_bytes(KIMI_CUDA)  # b12x's cudaMalloc of one channel's IPC slab
    detector.note_graph_pool(GRAPH_POOL)
    detector.stop()
    return detector.events


def test_a_lazily_created_production_slab_is_caught_under_the_run_floor() -> None:
    registry = SimpleNamespace(backend="b12x", signatures=lambda: (KIMI_CUDA,))
    [event] = _lazy_slab(memory_floor(registry))
    assert "device memory grew by 2041856 bytes" in event.what
    assert _lazy_slab(DEFAULT_DRIVER_TOLERANCE) == []  # the fixed 16 MiB floor missed it


def test_b12x_frozen_preparation_runtime_error_is_a_lazy_event() -> None:
    """b12x 1.5.1's own `prepare_default` under its own guard raises a plain RuntimeError."""
    pytest.importorskip("b12x.preparation", exc_type=ModuleNotFoundError)
    from b12x.preparation import prepare_default

    detector = B12xKernelResolutionDetector(cuda_available=lambda: True)
    detector.start()
    request = SimpleNamespace(name="dcpqual:gather", plan=SimpleNamespace(component_id="comm.pcie"))
    with pytest.raises(RuntimeError) as info:
        prepare_default(request)
    detector.stop()
    assert type(info.value) is RuntimeError
    assert str(info.value) == "comm.pcie plan is not prepared and kernel resolution is frozen"
    wrapped = RuntimeError("capture failed")
    wrapped.__cause__ = info.value
    event = detector.explain(wrapped)
    assert event is not None and "plan is not prepared" in event.what
    assert detector.explain(wrapped) is None  # reported once
    assert detector.explain(RuntimeError("comm.pcie plan is not ready")) is None


def test_the_capture_time_unprepared_plan_error_is_recognized() -> None:
    rc = _fake_runtime_control()
    detector = B12xKernelResolutionDetector(rc, cuda_available=lambda: True)
    detector.start()
    text = (
        "comm.pcie plan 'x' is not prepared; a shape used under CUDA graph capture must be "
        "declared and prepared before the capture"
    )
    assert detector.explain(RuntimeError(text)) is not None
    assert detector.explain(ValueError(text)) is None  # only b12x's plain RuntimeError
    detector.stop()
