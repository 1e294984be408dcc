"""The detector plugin contract: start/stop around a capture window, a list of `LazyEvent`s.

A detector watches one kind of lazy work (a transport created on first use, a new process group,
a JIT compile, device memory growth). The window starts every active detector when it opens and
stops them when it closes; each detector reports what it saw through `report`, which appends a
`LazyEvent` and hands it to the window's sink. In strict mode the sink raises
`LazySpecializationError` at once (so the error points at the lazy call itself); detectors whose
hook runs inside code that would swallow or wrap an exception (dynamo's compile callbacks) collect
their events and report them when they stop, and the window raises then.

A detector that cannot run on this machine says why (`unavailable_reason`), and the window lists
it with that reason in the record instead of letting it pass silently.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar

import torch

from harness.capture.events import LazyEvent
from harness.core.signature import TransportSignature
from harness.schema.capture import DetectorStatus
from harness.transport.events import caller_stack

Sink = Callable[[LazyEvent], None]

_HERE = Path(__file__).resolve().parent
# The window and the detectors themselves: never the code that asked for lazy work.
_MACHINERY = tuple(
    str(_HERE / name) for name in ("detector.py", "detectors.py", "gpu_detectors.py", "window.py")
)
assert torch.__file__ is not None  # a regular package, never a namespace one
_TORCH_PACKAGE = str(Path(torch.__file__).resolve().parent)
_SKIPPED = (*_MACHINERY, _TORCH_PACKAGE)
# The memory pool a captured CUDA graph owns (`torch.cuda.CUDAGraph.pool()`).
GraphPool = tuple[int, int]


def short_stack(limit: int = 8) -> str:
    """The caller's last `limit` frames, without the window, the detectors and torch internals.

    What a reviewer needs is the code that asked for the lazy work (a decode step calling
    `registry.get`, a test calling `new_group`), not the detector's hook, dynamo's frames or
    the import machinery's.
    """
    return caller_stack(_SKIPPED, limit, named=("<frozen importlib",))


class Detector(ABC):
    """One kind of lazy work; see the module doc. Subclasses set `name` and implement
    `_install`/`_uninstall` (and `_collect` for checks made at stop, e.g. counter deltas)."""

    name: ClassVar[str]

    def __init__(self) -> None:
        self._running = False
        self._begin(None, rank=0)

    def _begin(self, sink: Sink | None, *, rank: int) -> None:
        """A new window's state: no events yet, its sink and rank, in the warm-up phase."""
        self.events: list[LazyEvent] = []
        self._sink = sink
        self._rank = rank
        self._phase = "warmup"

    # -- what the window asks ---------------------------------------------------------------

    def unavailable_reason(self) -> str | None:
        """Why this detector cannot run on this machine, or None when it can."""
        return None

    def status(self) -> DetectorStatus:
        reason = self.unavailable_reason()
        return DetectorStatus(name=self.name, active=reason is None, reason=reason or "")

    def blind_spots(self) -> tuple[DetectorStatus, ...]:
        """What this active detector cannot watch in this window though it runs (each an
        inactive status of its own name, so the evidence names it as a limitation)."""
        return ()

    @property
    def running(self) -> bool:
        return self._running

    def start(self, sink: Sink | None = None, *, rank: int = 0) -> None:
        """Begin watching; events go to `sink` (which may raise, in strict mode)."""
        if self._running:
            raise RuntimeError(f"detector {self.name!r} is already running")
        reason = self.unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"detector {self.name!r} cannot run here: {reason}")
        self._begin(sink, rank=rank)
        self._install()
        self._running = True

    def enter_phase(self, phase: str) -> None:
        """The window moves from its warm-up iterations ("warmup") to the capture ("capture")."""
        self._phase = phase

    def note_graph_pool(self, pool: GraphPool) -> None:  # noqa: B027 - optional hook
        """The CUDA path tells detectors which memory pool the captured graph owns."""

    def stop(self) -> None:
        """Stop watching: report what only shows at the end (deltas), then remove every hook.

        Hooks are removed even when the final report raises (strict mode).
        """
        if not self._running:
            return
        try:
            self._collect()
        finally:
            self._running = False
            self._uninstall()
            self._sink = None

    def explain(self, exc: BaseException) -> LazyEvent | None:
        """Turn an exception that escaped the captured step into an event, if it is this
        detector's kind of lazy work (b12x refusing a kernel resolution); None otherwise."""
        return None

    # -- what subclasses call ---------------------------------------------------------------

    def report(
        self,
        what: str,
        *,
        signature: TransportSignature | None = None,
        stack: str | None = None,
        phase: str | None = None,
    ) -> LazyEvent:
        """Record one lazy event and hand it to the sink (which raises in strict mode)."""
        event = LazyEvent(
            detector=self.name,
            rank=self._rank,
            what=what,
            signature=signature,
            stack=short_stack() if stack is None else stack,
            phase=self._phase if phase is None else phase,
        )
        self.events.append(event)
        if self._sink is not None:
            self._sink(event)
        return event

    # -- what subclasses implement ----------------------------------------------------------

    @abstractmethod
    def _install(self) -> None:
        """Hook in (subscribe, patch, register a callback, take a baseline)."""

    @abstractmethod
    def _uninstall(self) -> None:
        """Undo exactly what `_install` did; must not raise."""

    def _collect(self) -> None:  # noqa: B027 - optional hook, most detectors report live
        """Report what only shows at stop (counter or memory deltas)."""


def without(detectors: Iterable[Detector], *names: str) -> list[Detector]:
    """The detectors minus those named: how a negative control shows it depends on one."""
    detectors = list(detectors)
    unknown = set(names) - {d.name for d in detectors}
    if unknown:
        raise ValueError(f"no detector named {sorted(unknown)}")
    return [d for d in detectors if d.name not in names]
