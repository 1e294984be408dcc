"""The Triton and b12x detectors against the real packages (`nox -s compat` installs b12x 1.5.1,
which brings Triton). Without a GPU nothing can compile, so the tests drive the exact entry
points the libraries call (Triton's `knobs.runtime.jit_post_compile_hook`, b12x's
`runtime_control.raise_if_kernel_resolution_frozen`) with CUDA availability patched in."""

from __future__ import annotations

import inspect

import pytest
import torch

from harness.capture.controls import B12xResolutionControl, ControlContext
from harness.capture.events import LazySpecializationError
from harness.capture.gpu_detectors import (
    B12X_GUARD_REASON,
    B12xKernelResolutionDetector,
    TritonJitDetector,
)
from harness.capture.window import CaptureWindow

pytestmark = pytest.mark.compat


def _yes() -> bool:
    return True


def test_triton_detector_installs_and_restores_the_real_hook() -> None:
    knobs = pytest.importorskip("triton").knobs
    hook_params = set(inspect.signature(knobs.JITHook.__call__).parameters)
    assert {"key", "repr", "fn", "compile", "is_manual_warmup", "already_compiled"} <= hook_params
    before = knobs.runtime.jit_post_compile_hook
    detector = TritonJitDetector(cuda_available=_yes)
    assert detector.status().active
    detector.start()
    hook = knobs.runtime.jit_post_compile_hook
    hook(key="k", repr="fill[num_warps=4](out_ptr: *fp32)", fn=None, compile={},
         is_manual_warmup=False, already_compiled=False)  # fmt: skip
    detector.stop()
    assert knobs.runtime.jit_post_compile_hook is before
    [event] = detector.events
    assert "fill[num_warps=4]" in event.what
    if not torch.cuda.is_available():
        assert "CUDA is not available" in TritonJitDetector().status().reason


def test_b12x_detector_freezes_real_kernel_resolution_for_the_window() -> None:
    b12x = pytest.importorskip("b12x")
    rc = pytest.importorskip("b12x._lib.runtime_control")
    bound = rc.raise_if_kernel_resolution_frozen  # a call site that imported it at load time
    detector = B12xKernelResolutionDetector(cuda_available=_yes)
    assert detector.status().active
    assert not b12x.kernel_resolution_frozen()
    detector.start()
    assert b12x.kernel_resolution_frozen()
    from b12x._lib.runtime_control import raise_if_kernel_resolution_frozen as late

    with pytest.raises(b12x.KernelResolutionFrozenError, match=B12X_GUARD_REASON):
        late("Triton JIT miss", cache_key=("k",))
    with pytest.raises(b12x.KernelResolutionFrozenError) as info:
        bound("cute.compile")
    wrapped = RuntimeError("capture failed")
    wrapped.__cause__ = info.value
    assert detector.explain(wrapped) is not None
    detector.stop()
    assert not b12x.kernel_resolution_frozen()
    assert rc.raise_if_kernel_resolution_frozen is bound
    assert [e.what.split("refusing ")[1].split(";")[0] for e in detector.events] == [
        "Triton JIT miss",
        "cute.compile",
    ]


@pytest.mark.parametrize("removed", [False, True], ids=["detected", "detector-removed"])
def test_b12x_control_depends_on_its_detector(removed: bool) -> None:
    pytest.importorskip("b12x")
    control = B12xResolutionControl(ControlContext(None, torch.device("cpu"), 0, 1))
    control.setup()
    detectors = [] if removed else [B12xKernelResolutionDetector(cuda_available=_yes)]
    window = CaptureWindow(detectors, mode="record")

    def step(inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        control.provoke()
        return inputs[0]

    window.capture(step, torch.zeros(1))
    assert control.happened() == 1
    assert bool(window.events) is not removed


def test_b12x_strict_window_fails_on_a_kernel_resolution() -> None:
    pytest.importorskip("b12x")
    control = B12xResolutionControl(ControlContext(None, torch.device("cpu"), 0, 1))
    control.setup()
    window = CaptureWindow([B12xKernelResolutionDetector(cuda_available=_yes)])
    with pytest.raises(LazySpecializationError, match="b12x-kernel-resolution"):
        window.capture(lambda inputs: (control.provoke(), inputs[0])[1], torch.zeros(1))
