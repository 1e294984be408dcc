"""The capture window on both paths, without a GPU and without a process group.

The CPU path runs for real. The CUDA path runs against a fake `torch.cuda` that records the
sequence of calls (side stream, warm-up, `torch.cuda.graph(..., capture_error_mode=
"thread_local")`, replay), and the real `torch.cuda` API is checked to accept the calls the
window makes, so the GPU path is written against what PyTorch 2.13 really offers.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import pytest
import torch
from _support.cuda_sim import SimCuda, SimGraph, SimStream

from harness.capture.detector import Detector
from harness.capture.events import LazyEvent, LazySpecializationError
from harness.capture.window import CPU_SIMULATED, CUDA_GRAPH, CaptureWindow
from harness.errors import QualificationError, UsageError


class FakeRegistry:
    def __init__(self) -> None:
        self.is_frozen = False
        self.frozen_seen: list[bool] = []

    @contextlib.contextmanager
    def frozen(self) -> Iterator[FakeRegistry]:
        self.is_frozen = True
        try:
            yield self
        finally:
            self.is_frozen = False


class Probe(Detector):
    """Reports `what` whenever `fire()` is called; records its lifecycle in `log`."""

    def __init__(self, name: str = "probe", log: list[str] | None = None) -> None:
        super().__init__()
        self.name = name  # type: ignore[misc]
        self.log = [] if log is None else log
        self.at_stop: list[str] = []

    def fire(self, what: str = "lazy") -> None:
        if self.running:
            self.report(what)

    def _install(self) -> None:
        self.log.append(f"{self.name}.start")

    def enter_phase(self, phase: str) -> None:
        super().enter_phase(phase)
        self.log.append(f"{self.name}.{phase}")

    def note_graph_pool(self, pool: object) -> None:
        self.log.append(f"{self.name}.pool={pool}")

    def _collect(self) -> None:
        for what in self.at_stop:
            self.report(what)

    def _uninstall(self) -> None:
        self.log.append(f"{self.name}.stop")


class Unavailable(Probe):
    def unavailable_reason(self) -> str | None:
        return "needs a GPU"


def _step(
    probe: Probe | None = None,
    calls: list[str] | None = None,
    fire_on: int = -1,
    finished: list[int] | None = None,
):
    """A step that fires `probe` on call `fire_on`; `finished` gets each call that ran past it."""
    count = {"n": 0}

    def step(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        count["n"] += 1
        if calls is not None:
            calls.append("step")
        if probe is not None and count["n"] == fire_on:
            probe.fire(f"lazy on call {count['n']}")
        if finished is not None:
            finished.append(count["n"])
        x, y = inputs
        return (x * 2 + y, x.sum().reshape(1))

    return step


def _inputs(seed: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.full((3,), seed), torch.arange(3.0))


# -- CPU simulation ---------------------------------------------------------------------------


def test_cpu_capture_replays_fresh_inputs_through_static_buffers() -> None:
    registry = FakeRegistry()
    log: list[str] = []
    probe = Probe(log=log)
    window = CaptureWindow([probe], registry=registry)
    static = _inputs(1.0)
    captured = window.capture(_step(), static)
    assert captured.path == CPU_SIMULATED and captured.events == ()
    assert log == ["probe.start", "probe.capture", "probe.stop"]  # CPU: no warm-up by default
    first_outputs = captured.outputs
    out = captured.replay(_inputs(5.0))
    torch.testing.assert_close(out[0], torch.tensor([10.0, 11.0, 12.0]))
    torch.testing.assert_close(static[0], torch.full((3,), 5.0))  # copied into the statics
    assert captured.outputs[0] is first_outputs[0]  # results land in the static outputs
    assert out[0] is not captured.outputs[0]  # and the caller gets a copy
    assert captured.replays == 1
    assert not registry.is_frozen


def test_registry_is_frozen_and_detectors_watch_warmup_and_capture_not_replay() -> None:
    registry = FakeRegistry()
    probe = Probe()
    frozen: list[bool] = []

    def step(inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        frozen.append(registry.is_frozen)
        probe.fire()
        return inputs[0] + 1

    window = CaptureWindow([probe], registry=registry, mode="record", warmup_iters=2)
    captured = window.capture(step, torch.zeros(2))
    captured.replay(torch.ones(2))
    assert frozen == [True, True, True, False]
    assert [e.phase for e in captured.events] == ["warmup", "warmup", "capture"]


def test_strict_window_raises_at_the_first_event_and_stops_every_detector() -> None:
    log: list[str] = []
    first, second = Probe("first", log), Probe("second", log)
    window = CaptureWindow([first, second], registry=FakeRegistry(), warmup_iters=1)
    finished: list[int] = []
    with pytest.raises(LazySpecializationError, match="lazy on call 2") as info:
        window.capture(_step(second, fire_on=2, finished=finished), _inputs())
    # Raised at the lazy call itself: call 2 never ran past it (not an error found at close).
    assert finished == [1]
    assert info.value.event.detector == "second" and info.value.event.phase == "capture"
    assert log[-2:] == ["second.stop", "first.stop"]
    assert not first.running and not second.running


def test_strict_window_raises_at_close_for_events_reported_at_stop() -> None:
    probe = Probe()
    probe.at_stop = ["counted at stop"]
    window = CaptureWindow([probe])
    finished: list[int] = []
    with pytest.raises(LazySpecializationError, match="counted at stop") as info:
        window.capture(_step(finished=finished), _inputs())
    # Raised at close: the step ran to its end first, and the event has no live call site.
    assert finished == [1]
    assert info.value.event.detector == "probe"


def test_record_window_keeps_every_event_and_the_capture() -> None:
    probe = Probe()
    window = CaptureWindow([probe], mode="record", warmup_iters=1)
    captured = window.capture(_step(probe, fire_on=1), _inputs())
    assert [e.what for e in captured.events] == ["lazy on call 1"]
    assert window.events == captured.events
    captured.replay(_inputs(2.0))


def test_record_mode_turns_a_failure_after_lazy_work_into_a_value() -> None:
    probe = Probe()

    def step(inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        probe.fire("host-blocking creation")
        raise RuntimeError("operation not permitted when stream is capturing")

    captured = CaptureWindow([probe], mode="record").capture(step, torch.zeros(1))
    assert "operation not permitted" in captured.error
    with pytest.raises(QualificationError, match="cannot be replayed"):
        captured.replay(torch.zeros(1))


def test_a_failure_without_lazy_work_is_a_plain_error_in_both_modes() -> None:
    def step(inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        raise ValueError("a bug in the step")

    for mode in ("strict", "record"):
        with pytest.raises(ValueError, match="a bug in the step"):
            CaptureWindow([Probe()], mode=mode).capture(step, torch.zeros(1))


def test_strict_failure_after_lazy_work_names_the_lazy_event() -> None:
    class Explains(Probe):
        def explain(self, exc: BaseException) -> LazyEvent | None:
            return self.report(f"explained {exc}") if isinstance(exc, KeyError) else None

    def step(inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        raise KeyError("kernel")

    with pytest.raises(LazySpecializationError, match="explained 'kernel'") as info:
        CaptureWindow([Explains()]).capture(step, torch.zeros(1))
    assert isinstance(info.value.__cause__, KeyError)


def test_unavailable_detectors_are_listed_not_started() -> None:
    log: list[str] = []
    window = CaptureWindow([Probe("ok", log), Unavailable("gpu-only", log)])
    window.capture(_step(), _inputs())
    assert [s.active for s in window.statuses] == [True, False]
    assert window.limitations == ("gpu-only: needs a GPU",)
    assert not any(entry.startswith("gpu-only") for entry in log)


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="unknown capture mode"):
        CaptureWindow(mode="lenient")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="unknown capture path"):
        CaptureWindow(path="tpu")
    with pytest.raises(UsageError, match="share a name"):
        CaptureWindow([Probe(), Probe()])
    with pytest.raises(UsageError, match="needs CUDA inputs"):
        CaptureWindow(path=CUDA_GRAPH).capture(_step(), _inputs())
    captured = CaptureWindow().capture(_step(), _inputs())
    with pytest.raises(UsageError, match="must be"):
        captured.replay((torch.zeros(4), torch.zeros(3)))
    with pytest.raises(UsageError, match="takes 2 inputs"):
        captured.replay(torch.zeros(3))
    with pytest.raises(UsageError, match="must return a tensor"):
        CaptureWindow().capture(lambda inputs: None, torch.zeros(1))  # type: ignore[arg-type]


# -- CUDA path, with a fake graph API ---------------------------------------------------------


class FakeCudaGraphApi(SimCuda):
    """The `torch.cuda` calls the window makes, recorded in order (the stream and graph of
    `_support.cuda_sim`), the capture mode named, and a capture that can end broken."""

    def __init__(self, *, broken_capture: bool = False) -> None:
        super().__init__()
        self.broken_capture = broken_capture
        self.default = self.current = SimStream(self.calls, "current")

    @contextlib.contextmanager
    def graph(self, graph: SimGraph, *, stream: SimStream, capture_error_mode: str):
        self.calls.append(f"enter graph(stream={stream.name}, mode={capture_error_mode})")
        try:
            yield
        finally:
            self.calls.append("exit graph")
            if self.broken_capture:
                raise RuntimeError("CUDA error: operation failed due to a previous error")


def test_cuda_path_follows_the_documented_capture_recipe() -> None:
    cuda = FakeCudaGraphApi()
    log: list[str] = []
    probe = Probe(log=log)
    window = CaptureWindow([probe], path=CUDA_GRAPH, cuda=cuda)
    captured = window.capture(_step(calls=cuda.calls), _inputs())
    assert captured.path == CUDA_GRAPH
    assert cuda.calls == [
        "Stream()",
        "side.wait_stream(current)",
        "enter stream(side)",
        "step",
        "step",
        "step",
        "exit stream(side)",
        "current.wait_stream(side)",
        "CUDAGraph()",
        "enter graph(stream=side, mode=thread_local)",
        "step",
        "exit graph",
    ]
    assert log == ["probe.start", "probe.capture", "probe.pool=(1, 2)", "probe.stop"]
    cuda.calls.clear()
    captured.outputs[0].fill_(7.0)  # what the graph would write
    out = captured.replay(_inputs(4.0))
    assert cuda.calls == ["graph.replay"]  # no Python step on replay
    torch.testing.assert_close(out[0], torch.full((3,), 7.0))
    torch.testing.assert_close(captured.static_inputs[0], torch.full((3,), 4.0))
    captured.close()
    assert cuda.calls[-1] == "graph.reset"


class ScopedRegistry:
    """A registry with a capture scope (b12x's graph channels), logging into the CUDA calls."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def frozen(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def capture_scope(self, stream: SimStream) -> Iterator[None]:
        self.calls.append(f"enter capture_scope({stream.name})")
        yield
        self.calls.append("exit capture_scope")


def test_cuda_path_enters_the_capture_scope_before_warmup_and_detectors() -> None:
    """b12x's graph channel must be entered before capture begins, and the side-stream warm-up
    must already run on it: the scope opens first and closes after the graph."""
    cuda = FakeCudaGraphApi()
    probe = Probe(log=cuda.calls)
    window = CaptureWindow([probe], registry=ScopedRegistry(cuda.calls), path=CUDA_GRAPH, cuda=cuda)
    window.capture(_step(calls=cuda.calls), _inputs())
    calls = cuda.calls
    assert calls[:3] == ["Stream()", "enter capture_scope(side)", "probe.start"]
    assert calls.index("enter stream(side)") > calls.index("enter capture_scope(side)")
    assert calls[-3:] == ["probe.pool=(1, 2)", "probe.stop", "exit capture_scope"]
    assert calls.index("exit graph") < calls.index("exit capture_scope")


def test_cpu_path_enters_no_capture_scope() -> None:
    calls: list[str] = []
    CaptureWindow(registry=ScopedRegistry(calls), path=CPU_SIMULATED).capture(
        _step(calls=calls), _inputs()
    )
    assert "enter capture_scope(side)" not in calls and calls == ["step"]


def test_cuda_strict_error_survives_a_capture_that_cannot_end() -> None:
    cuda = FakeCudaGraphApi(broken_capture=True)
    probe = Probe()
    window = CaptureWindow([probe], path=CUDA_GRAPH, cuda=cuda, warmup_iters=0)
    with pytest.raises(LazySpecializationError, match="lazy on call 1") as info:
        window.capture(_step(probe, fire_on=1), _inputs())
    assert "previous error" in str(info.value.__cause__)


def test_cuda_record_mode_keeps_the_events_of_a_broken_capture() -> None:
    cuda = FakeCudaGraphApi(broken_capture=True)
    probe = Probe()
    window = CaptureWindow([probe], path=CUDA_GRAPH, cuda=cuda, mode="record", warmup_iters=0)
    captured = window.capture(_step(probe, fire_on=1), _inputs())
    assert [e.what for e in captured.events] == ["lazy on call 1"]
    assert "previous error" in captured.error


def test_the_real_torch_cuda_api_accepts_the_windows_calls() -> None:
    """Binding check: CPU torch still defines the CUDA graph API (it refuses to build it)."""
    inspect.signature(torch.cuda.graph).bind(
        object(), stream=None, capture_error_mode="thread_local"
    )
    inspect.signature(torch.cuda.Stream).bind(device=torch.device("cuda", 0))
    inspect.signature(torch.cuda.current_stream).bind(torch.device("cuda", 0))
    inspect.signature(torch.cuda.stream).bind(None)
    for method in ("replay", "pool", "reset", "capture_begin", "capture_end"):
        assert callable(getattr(torch.cuda.CUDAGraph, method))
    assert callable(torch.cuda.Stream.wait_stream)
    for fn in (torch.cuda.memory_snapshot, torch.cuda.memory_stats, torch.cuda.mem_get_info):
        assert callable(fn)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError):
            torch.cuda.CUDAGraph()
