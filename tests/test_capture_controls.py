"""Each negative control is reported by its detector, and by nothing once that detector is
removed, although the work was done: the control depends on that detector and no other.

Single process: the registry, buffer and dynamo controls need no process group. The process
group control (and every control at 2-16 ranks) runs in suites/capture, which
`test_capture_suite.py` launches under torchrun.
"""

from __future__ import annotations

import pytest
import torch

from harness.capture.check import DETECTOR_NAMES, default_detectors
from harness.capture.controls import CONTROLS, ControlContext
from harness.capture.detector import without
from harness.capture.events import LazySpecializationError
from harness.capture.window import CaptureWindow
from harness.transport.registry import TransportRegistry

SINGLE_PROCESS = ("transport-registry", "transport-buffers", "dynamo")


def test_every_detector_has_a_control_and_a_default_instance() -> None:
    assert set(CONTROLS) == set(DETECTOR_NAMES)
    names = [d.name for d in default_detectors(TransportRegistry())]
    assert tuple(names) == DETECTOR_NAMES


def test_gpu_detectors_say_why_they_cannot_run_on_cpu_torch() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    statuses = {s.name: s for s in (d.status() for d in default_detectors(TransportRegistry()))}
    for name in ("cuda-memory", "triton-jit", "b12x-kernel-resolution"):
        assert not statuses[name].active and statuses[name].reason
    for name in ("transport-registry", "transport-buffers", "process-groups", "dynamo"):
        assert statuses[name].active, statuses[name].reason


def _run(name: str, *, removed: bool, mode: str = "record") -> tuple[CaptureWindow, int]:
    registry = TransportRegistry()
    control = CONTROLS[name](ControlContext(registry, torch.device("cpu"), 0, 2))
    control.setup()
    detectors = default_detectors(registry)
    if removed:
        detectors = without(detectors, name)
    window = CaptureWindow(detectors, registry=registry, mode=mode)  # type: ignore[arg-type]

    def step(inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        control.provoke()
        return inputs[0] + 1

    before = control.happened()
    try:
        window.capture(step, torch.zeros(2))
    finally:
        done = control.happened() - before
    return window, done


@pytest.mark.slow
@pytest.mark.parametrize("name", SINGLE_PROCESS)
def test_control_is_reported_by_its_detector_alone(name: str) -> None:
    window, done = _run(name, removed=False)
    assert done == 1  # one lazy action, reported once, by its own detector only
    assert [e.detector for e in window.events] == [name]


@pytest.mark.slow
@pytest.mark.parametrize("name", SINGLE_PROCESS)
def test_control_goes_unseen_without_its_detector(name: str) -> None:
    window, done = _run(name, removed=True)
    assert done > 0, "the control must still do its lazy work"
    assert window.events == ()


@pytest.mark.slow
@pytest.mark.parametrize("name", SINGLE_PROCESS)
def test_strict_window_fails_on_the_control(name: str) -> None:
    with pytest.raises(LazySpecializationError, match=name):
        _run(name, removed=False, mode="strict")
