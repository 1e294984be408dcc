"""The capture window: one API over a real CUDA graph capture and its CPU simulation.

`CaptureWindow(detectors, registry=..., mode=...).capture(step, static_inputs)` opens the window
(transport registry frozen, every active detector started), runs the step's warm-up iterations,
captures it, closes the window, and returns a `CapturedStep` that replays the capture with fresh
inputs copied into the static input buffers.

- `cuda-graph` (inputs on a CUDA device): PyTorch's documented recipe. Warm-up iterations run on
  a side stream that waits on the current one; the current stream then waits on it; the step is
  captured with `torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local")`;
  `replay` copies the inputs in and calls `graph.replay()`. Before the warm-up (and before the
  detectors start), the registry's `capture_scope(side)` is entered, and left after the capture:
  b12x's graph-owned channel must be entered before capture begins, and its stream-affine
  channels need the side-stream warm-up to run on that graph channel, not the eager one.
- `cpu-simulated` (CPU inputs; CPU torch cannot build a `torch.cuda.CUDAGraph`): the same
  window, with the captured step recorded and re-executed on replay, its results copied into
  the static outputs so replay has the graph's semantics (outputs live in fixed buffers).

Detectors watch the warm-up iterations and the capture, not the replays: replaying a CUDA graph
runs no Python, so the simulation does not watch its re-executions either.

Modes: `strict` raises `LazySpecializationError` at the first lazy event (for detectors that can
only report at close, when the window closes); `record` lets the step run on and keeps every
event, for negative controls. In record mode a step that fails after lazy work was seen (a
capture broken by a host-blocking creation) becomes `CapturedStep.error` instead of an
exception; a failure with no lazy event is a plain error and propagates in both modes.

The CUDA calls go through `cuda` (default `torch.cuda`), so unit tests check the sequence of
calls with a fake graph API on a machine without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist

from harness.capture.detector import Detector
from harness.capture.events import LazyEvent, LazySpecializationError
from harness.errors import QualificationError, UsageError
from harness.schema.capture import DetectorStatus

Mode = Literal["strict", "record"]
MODES: tuple[str, ...] = ("strict", "record")
CUDA_GRAPH = "cuda-graph"
CPU_SIMULATED = "cpu-simulated"
PATHS: tuple[str, ...] = (CUDA_GRAPH, CPU_SIMULATED)
# PyTorch's whole-network capture example warms up 3 iterations on a side stream, to settle
# allocator and library first use before capture. The CPU simulation has no such first use, so
# its capture is the step's first execution inside the window (detectors watch both phases).
DEFAULT_WARMUP_ITERS = {CUDA_GRAPH: 3, CPU_SIMULATED: 0}

Outputs = tuple[torch.Tensor, ...]
Step = Callable[[tuple[torch.Tensor, ...]], torch.Tensor | Sequence[torch.Tensor]]


class FreezableRegistry(Protocol):
    """What the window needs from a transport registry: `TransportRegistry.frozen()` (and, on
    the CUDA path, `capture_scope(stream)` where the registry has one)."""

    def frozen(self) -> AbstractContextManager[Any]: ...


def _capture_scope(registry: FreezableRegistry | None, stream: Any) -> AbstractContextManager[Any]:
    scope = getattr(registry, "capture_scope", None)
    return nullcontext() if scope is None else scope(stream)


def _as_inputs(static_inputs: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    inputs = (static_inputs,) if isinstance(static_inputs, torch.Tensor) else tuple(static_inputs)
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise UsageError(f"a captured step takes one or more tensors, got {static_inputs!r}")
    return inputs


def _as_outputs(result: object) -> Outputs:
    if isinstance(result, torch.Tensor):
        return (result,)
    if isinstance(result, Sequence) and result and all(isinstance(t, torch.Tensor) for t in result):
        return tuple(result)
    raise UsageError(
        f"a captured step must return a tensor or a sequence of tensors, got {type(result)}"
    )


@dataclass
class CapturedStep:
    """A captured step: replay it with fresh inputs (a handle, not a value; see `window`).

    `error` is set only in record mode, when the step failed inside the window after lazy work
    was seen; such a capture cannot be replayed.
    """

    path: str
    static_inputs: tuple[torch.Tensor, ...]
    outputs: Outputs
    events: tuple[LazyEvent, ...]
    error: str = ""
    replays: int = 0
    _run: Callable[[], None] | None = field(default=None, repr=False)
    _close: Callable[[], None] | None = field(default=None, repr=False)

    def replay(self, inputs: torch.Tensor | Sequence[torch.Tensor]) -> Outputs:
        """Copy `inputs` into the static inputs, replay, and return copies of the outputs."""
        if self.error or self._run is None:
            raise QualificationError(f"this capture failed and cannot be replayed: {self.error}")
        fresh = _as_inputs(inputs)
        if len(fresh) != len(self.static_inputs):
            raise UsageError(f"replay takes {len(self.static_inputs)} inputs, got {len(fresh)}")
        for i, (static, new) in enumerate(zip(self.static_inputs, fresh, strict=True)):
            if new.shape != static.shape or new.dtype != static.dtype:
                raise UsageError(
                    f"replay input {i} must be {list(static.shape)} {static.dtype} like the "
                    f"captured one, got {list(new.shape)} {new.dtype}"
                )
            static.copy_(new)
        self._run()
        self.replays += 1
        return tuple(out.clone() for out in self.outputs)

    def close(self) -> None:
        """Release the graph (CUDA) or the recorded step (CPU)."""
        if self._close is not None:
            self._close()
        self._run = self._close = None


class CaptureWindow:
    """Opens a capture window around a step; see the module doc."""

    def __init__(
        self,
        detectors: Iterable[Detector] = (),
        *,
        registry: FreezableRegistry | None = None,
        mode: Mode = "strict",
        path: str = "auto",
        rank: int | None = None,
        warmup_iters: int | None = None,
        cuda: Any = None,
    ) -> None:
        if mode not in MODES:
            raise UsageError(f"unknown capture mode {mode!r}; expected one of {MODES}")
        if path != "auto" and path not in PATHS:
            raise UsageError(f"unknown capture path {path!r}; expected 'auto' or one of {PATHS}")
        if warmup_iters is not None and warmup_iters < 0:
            raise UsageError(f"warmup_iters must be >= 0, got {warmup_iters}")
        self.detectors = tuple(detectors)
        names = [d.name for d in self.detectors]
        if len(set(names)) != len(names):
            raise UsageError(f"two detectors share a name: {names}")
        self.registry = registry
        self.mode = mode
        self.path = path
        self.warmup_iters = warmup_iters
        self._rank = rank
        self._cuda = torch.cuda if cuda is None else cuda
        own = tuple(d.status() for d in self.detectors)
        self.active: tuple[Detector, ...] = tuple(
            d for d, s in zip(self.detectors, own, strict=True) if s.active
        )
        self.statuses: tuple[DetectorStatus, ...] = own + tuple(
            spot for d in self.active for spot in d.blind_spots()
        )
        self._events: list[LazyEvent] = []
        self._deferred = False

    # -- what the window saw ----------------------------------------------------------------

    @property
    def events(self) -> tuple[LazyEvent, ...]:
        return tuple(self._events)

    @property
    def limitations(self) -> tuple[str, ...]:
        """One line per detector that could not run here, with its reason."""
        return tuple(f"{s.name}: {s.reason}" for s in self.statuses if not s.active)

    @property
    def rank(self) -> int:
        if self._rank is not None:
            return self._rank
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    def _sink(self, event: LazyEvent) -> None:
        self._events.append(event)
        if self.mode == "strict" and not self._deferred:
            raise LazySpecializationError(event)

    def _set_phase(self, phase: str) -> None:
        for detector in self.active:
            detector.enter_phase(phase)

    def _explain(self, exc: BaseException) -> None:
        self._deferred = True
        try:
            for detector in self.active:
                detector.explain(exc)
        finally:
            self._deferred = False

    def _stop(self, started: Sequence[Detector]) -> list[BaseException]:
        self._deferred = True
        errors: list[BaseException] = []
        try:
            for detector in reversed(started):
                try:
                    detector.stop()
                except Exception as exc:  # keep stopping the others, then report it
                    errors.append(exc)
        finally:
            self._deferred = False
        return errors

    # -- opening and capturing --------------------------------------------------------------

    @contextmanager
    def watching(self) -> Iterator[CaptureWindow]:
        """The window without a graph: registry frozen and detectors on while inside.

        On a clean exit in strict mode, events reported at close raise here.
        """
        self._events = []
        rank = self.rank
        frozen = self.registry.frozen() if self.registry is not None else nullcontext()
        started: list[Detector] = []
        with frozen:
            try:
                for detector in self.active:
                    detector.start(self._sink, rank=rank)
                    started.append(detector)
                yield self
            except BaseException:
                self._stop(started)
                raise
            errors = self._stop(started)
        if errors:
            raise errors[0]
        if self.mode == "strict" and self._events:
            raise LazySpecializationError(self._events[0])

    def _choose_path(self, inputs: tuple[torch.Tensor, ...]) -> str:
        on_cuda = inputs[0].device.type == "cuda"
        if self.path == "auto":
            return CUDA_GRAPH if on_cuda else CPU_SIMULATED
        if self.path == CUDA_GRAPH and not on_cuda and self._cuda is torch.cuda:
            raise UsageError(f"the cuda-graph path needs CUDA inputs, got {inputs[0].device}")
        return self.path

    def capture(
        self, step: Step, static_inputs: torch.Tensor | Sequence[torch.Tensor]
    ) -> CapturedStep:
        """Warm up and capture `step(static_inputs)` inside the window; see the module doc."""
        inputs = _as_inputs(static_inputs)
        path = self._choose_path(inputs)
        warmup = self.warmup_iters
        if warmup is None:
            warmup = DEFAULT_WARMUP_ITERS[path]
        result = CapturedStep(path=path, static_inputs=inputs, outputs=(), events=())
        side: Any = None
        scope: AbstractContextManager[Any] = nullcontext()
        if path == CUDA_GRAPH:
            side = self._cuda.Stream(device=inputs[0].device)
            scope = _capture_scope(self.registry, side)
        with scope, self.watching():
            try:
                if path == CUDA_GRAPH:
                    self._capture_cuda(step, inputs, warmup, result, side)
                else:
                    self._capture_cpu(step, inputs, warmup, result)
            except LazySpecializationError:
                raise
            except Exception as exc:
                self._explain(exc)
                if not self._events:
                    raise
                if self.mode == "strict":
                    raise LazySpecializationError(self._events[0]) from exc
                result.error = f"{type(exc).__name__}: {exc}"
                result._run = result._close = None
        result.events = self.events
        return result

    def _capture_cpu(
        self, step: Step, inputs: tuple[torch.Tensor, ...], warmup: int, result: CapturedStep
    ) -> None:
        for _ in range(warmup):
            _as_outputs(step(inputs))
        self._set_phase("capture")
        outputs = _as_outputs(step(inputs))
        result.outputs = outputs

        def run() -> None:
            fresh = _as_outputs(step(inputs))
            for static, new in zip(outputs, fresh, strict=True):
                static.copy_(new)

        result._run = run

    def _capture_cuda(
        self,
        step: Step,
        inputs: tuple[torch.Tensor, ...],
        warmup: int,
        result: CapturedStep,
        side: Any,
    ) -> None:
        cuda, device = self._cuda, inputs[0].device
        side.wait_stream(cuda.current_stream(device))
        with cuda.stream(side):
            for _ in range(warmup):
                _as_outputs(step(inputs))
        cuda.current_stream(device).wait_stream(side)

        graph = cuda.CUDAGraph()
        self._set_phase("capture")
        step_error: BaseException | None = None
        try:
            with cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                try:
                    outputs = _as_outputs(step(inputs))
                except BaseException as exc:
                    step_error = exc
                    raise
        except BaseException as exc:
            # Ending a capture that the step broke raises its own error; the step's (a lazy
            # event in strict mode) is the one that names the cause.
            if step_error is not None and exc is not step_error:
                raise step_error from exc
            raise
        for detector in self.active:
            detector.note_graph_pool(graph.pool())
        result.outputs = outputs
        result._run = graph.replay
        result._close = graph.reset
