"""The detectors that run on every machine: transport registry, transport buffers, process
groups, dynamo compiles. The GPU-only ones live in `gpu_detectors`.

Each detector reports live through a hook (a registry subscription, a wrapped function, a dynamo
callback) and checks a counter at stop as a backstop, so lazy work that went around the hook
(code holding the original `new_group`, a registry event nobody delivered) still shows up.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import re
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from harness.capture.detector import Detector, short_stack
from harness.core import preloaded
from harness.schema.capture import IMPORT_BLIND, DetectorStatus
from harness.transport.events import (
    BufferAllocated,
    OperationFirstUse,
    RegistryEvent,
    RegistryMiss,
    TransportCreated,
)

# -- transport registry ---------------------------------------------------------------------


@runtime_checkable
class ObservableRegistry(Protocol):
    """What the registry detectors need: `TransportRegistry` satisfies it, so do test fakes."""

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]: ...

    @property
    def counters(self) -> Any: ...


class _RegistryDetector(Detector):
    """Subscribes to one registry while the window is open: reports the events it describes
    live, and at stop what the registry counted beyond those events (the backstop)."""

    # Per counter of the registry's `counters`: how the live events it counts begin, and the
    # word the backstop uses for them.
    backstops: ClassVar[tuple[tuple[str, str, str], ...]]
    counted_by: ClassVar[str]

    def __init__(self, registry: ObservableRegistry) -> None:
        super().__init__()
        self.registry = registry
        # Set by `_install` (`_uninstall` runs only after it succeeded): the registry's counters
        # when the window opened, and how to leave it.
        self._before: Any
        self._unsubscribe: Callable[[], None]

    def _install(self) -> None:
        self._before = self.registry.counters
        self._unsubscribe = self.registry.subscribe(self._on_event)

    def _uninstall(self) -> None:
        self._unsubscribe()

    def describe(self, event: RegistryEvent) -> str | None:
        """What this detector reports for a registry event; None for events of another kind."""
        raise NotImplementedError

    def _on_event(self, event: object) -> None:
        if isinstance(event, RegistryEvent) and (what := self.describe(event)) is not None:
            self.report(what, signature=event.signature, stack=event.stack or None)

    def _collect(self) -> None:
        after, before = self.registry.counters, self._before
        for counter, kind, noun in self.backstops:
            counted = getattr(after, counter) - getattr(before, counter)
            unseen = counted - sum(1 for e in self.events if e.what.startswith(kind))
            if unseen > 0:
                self.report(
                    f"{kind}: {self.counted_by} counted {unseen} more {noun} in the window than "
                    "its events reported"
                )


class TransportRegistryDetector(_RegistryDetector):
    """A transport looked up but not warmed (a miss), or created, while the window is open; or
    a warmed transport running an operation (gather, reduce) with a dtype it never ran before
    capture (b12x specializes its kernels per operation and dtype on first use).

    A miss is reported before the registry goes on to create anything, so in strict mode the
    error stops the lazy creation itself (and, since every rank misses the same signature, no
    rank enters the creation collective).
    """

    name = "transport-registry"
    counted_by = "the registry"
    backstops = (
        ("misses", "registry miss", "misses"),
        ("creations", "transport created", "creations"),
        ("first_uses", "first use of", "first_uses"),
    )

    def describe(self, event: RegistryEvent) -> str | None:
        if isinstance(event, RegistryMiss):
            return (
                f"registry miss in {event.op}: this transport was not warmed and would be "
                "created lazily inside capture"
            )
        if isinstance(event, TransportCreated):
            return f"transport created lazily inside capture ({event.backend}/{event.strategy})"
        if isinstance(event, OperationFirstUse):
            return (
                f"first use of {event.operation} with {event.dtype} inside capture: warmup never "
                "ran this operation with this dtype, so its kernels specialize lazily here"
            )
        return None


class TransportBufferDetector(_RegistryDetector):
    """A buffer allocated through the registry's allocator while the window is open.

    On CPU this is the simulation's memory-growth signal; on GPU it also
    catches lazy staging that the graph's private memory pool would hide from
    `torch.cuda.memory_stats()` deltas.
    """

    name = "transport-buffers"
    counted_by = "the registry's allocator"
    backstops = (("buffer_allocations", "buffer allocation", "allocations"),)

    def describe(self, event: RegistryEvent) -> str | None:
        if isinstance(event, BufferAllocated):
            return (
                f"buffer allocation {event.name!r} of {event.nbytes} bytes through the transport "
                "registry's allocator"
            )
        return None


# -- process groups -------------------------------------------------------------------------

GROUP_FACTORIES: tuple[str, ...] = (
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "split_group",
)


def _describe_call(args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    parts = [repr(a) for a in args[:2]]
    for key in ("ranks", "group_size", "ranks_per_subgroup_list", "split_ranks", "backend"):
        if key in kwargs:
            parts.append(f"{key}={kwargs[key]!r}")
    text = ", ".join(parts)
    return text if len(text) <= 120 else text[:117] + "..."


def c10d_groups(c10d: ModuleType | None = None) -> tuple[int, int]:
    """(group counter, groups held) of c10d's world: a new group moves one or both (the
    counter names unnamed groups; locally synchronized groups only enter the map)."""
    if c10d is None:
        import torch.distributed.distributed_c10d as real

        c10d = real
    world = c10d._world
    return int(world.group_count), len(world.pg_map)


class ProcessGroupDetector(Detector):
    """`torch.distributed.new_group` (and `new_subgroups`, `new_subgroups_by_enumeration`,
    `split_group`) called while the window is open: a new communicator (NCCL init on GPU).

    The factories are wrapped in `torch.distributed` and in `distributed_c10d` for the duration
    of the window; nested calls (`new_subgroups` calling `new_group`) are reported once. In
    strict mode the error is raised before the group is created, on every rank that asked.
    The c10d group counter is the backstop for groups created through a reference taken
    before the window opened.
    """

    name = "process-groups"

    def __init__(self, modules: Sequence[ModuleType] | None = None) -> None:
        super().__init__()
        if modules is None:
            import torch.distributed as dist
            import torch.distributed.distributed_c10d as c10d

            modules = (dist, c10d)
        self._modules = tuple(modules)
        self._patched: list[tuple[ModuleType, str, Callable[..., Any]]] = []
        self._depth = 0  # wrapped factory calls in progress (back to 0 after each call)
        self._before: tuple[int, int]  # c10d_groups() when the window opened

    def unavailable_reason(self) -> str | None:
        if not torch.distributed.is_available():
            return "torch.distributed is not available in this torch build"
        return None

    @property
    def _c10d(self) -> ModuleType | None:
        return next((m for m in self._modules if hasattr(m, "_world")), None)

    def _install(self) -> None:
        self._before = c10d_groups(self._c10d)
        wrapped: dict[int, Callable[..., Any]] = {}
        for module in self._modules:
            for name in GROUP_FACTORIES:
                original = getattr(module, name, None)
                if original is None:
                    continue
                if id(original) not in wrapped:
                    wrapped[id(original)] = self._wrap(name, original)
                self._patched.append((module, name, original))
                setattr(module, name, wrapped[id(original)])

    def _uninstall(self) -> None:
        for module, name, original in reversed(self._patched):
            setattr(module, name, original)
        self._patched.clear()

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                self.report(
                    f"torch.distributed.{name}({_describe_call(args, kwargs)}) inside the capture "
                    "window: a new process group and communicator"
                )
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        return wrapper

    def _collect(self) -> None:
        (count, held), (count_before, held_before) = c10d_groups(self._c10d), self._before
        created = max(count - count_before, held - held_before)
        if created > 0 and not self.events:
            self.report(
                f"{created} process group(s) created inside the capture window without going "
                "through a wrapped factory (seen by the c10d group counter)",
                stack="",
            )


# -- dynamo ---------------------------------------------------------------------------------

_COMPILE_ID = re.compile(r"(\d+)/(\d+)")


def describe_compile(compile_id: str, trigger: str) -> str:
    """'0/0' -> a first compile of frame 0, '0/2' -> its second recompile."""
    match = _COMPILE_ID.search(compile_id)
    if match and int(match.group(2)) > 0:
        kind = f"recompile #{match.group(2)} of frame {match.group(1)}"
    elif match:
        kind = f"first compile of frame {match.group(1)}"
    else:
        kind = "compile"
    return f"dynamo {kind} (compile id {compile_id}, trigger {trigger}) inside the capture window"


DYNAMO = "torch._dynamo"


class _ImportWatch(importlib.abc.MetaPathFinder):
    """First on `sys.meta_path` while a window is open and dynamo was never imported: notes
    where dynamo's import starts (with the phase), then lets the normal finders import it."""

    def __init__(self, detector: DynamoDetector) -> None:
        self.detector = detector
        self.seen: tuple[str, str] | None = None

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == DYNAMO and self.seen is None:
            self.seen = (short_stack(), self.detector._phase)
        return None


class DynamoDetector(Detector):
    """torch.compile work while the window is open: dynamo compiles and recompiles, and
    dynamo's own import.

    Armed lazily: in a process that never imported `torch._dynamo` nothing can have been
    compiled, and nothing can compile without importing it, so the detector watches for that
    import instead of importing dynamo itself (seconds of CPU and tens of MB on every rank).
    The import inside a window is reported as lazy work, with the stack that asked for it, and
    every frame compiled after it is counted (dynamo's `frames.total` counter starts at its
    import).

    Once dynamo is imported: live through dynamo's compile-start callback
    (`torch._dynamo.callback.callback_handler`); it runs inside dynamo, which wraps any
    exception it raises, so events are held and reported when the window closes (strict mode
    raises then). Backstop: the `frames.total` counter of `torch._dynamo.utils.counters`.
    """

    name = "dynamo"

    def __init__(self) -> None:
        super().__init__()
        # Set by `_install`: compiles started in the window (compile id, trigger, stack, phase)
        # and dynamo's frame counter when it opened.
        self._pending: list[tuple[str, str, str, str]]
        self._before: int
        self._handler: Any = None
        self._watch: _ImportWatch | None = None

    def unavailable_reason(self) -> str | None:
        if DYNAMO in sys.modules:
            return None
        try:
            found = importlib.util.find_spec(DYNAMO)
        except Exception as exc:  # a finder that fails for any reason means no detector
            return f"torch._dynamo is not importable ({type(exc).__name__}: {exc})"
        return None if found is not None else "torch._dynamo is not part of this torch build"

    def blind_spots(self) -> tuple[DetectorStatus, ...]:
        """Dynamo's import cannot be seen where the forkserver's preload imported it before this
        rank would have (vLLM's import, preloaded for a run that also builds real trees, before the
        stand-in windows); its compiles still are."""
        if DYNAMO in sys.modules and preloaded.early(DYNAMO):
            return (
                DetectorStatus(
                    name=IMPORT_BLIND,
                    active=False,
                    reason=(
                        "torch._dynamo was imported by the forkserver's preload before this "
                        "window, where a cold rank had not imported it: its lazy import in the "
                        "window could not be seen (its compiles were watched)"
                    ),
                ),
            )
        return ()

    @staticmethod
    def _frames() -> int:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["total"])

    def _install(self) -> None:
        self._pending = []
        if DYNAMO not in sys.modules:
            self._watch = _ImportWatch(self)
            sys.meta_path.insert(0, self._watch)
            return
        from torch._dynamo.callback import callback_handler

        self._before = self._frames()
        self._handler = callback_handler
        callback_handler.register_start_callback(self._on_start)

    def _uninstall(self) -> None:
        if self._watch is not None:
            with contextlib.suppress(ValueError):  # already removed: nothing left to undo
                sys.meta_path.remove(self._watch)
            self._watch = None
        if self._handler is not None:
            with contextlib.suppress(ValueError):  # already removed: nothing left to undo
                self._handler.remove_start_callback(self._on_start)
            self._handler = None

    def _on_start(self, args: Any) -> None:
        trigger = getattr(getattr(args, "callback_trigger", None), "name", "unknown")
        compile_id = str(getattr(args, "compile_id", "?"))
        self._pending.append((compile_id, trigger, short_stack(), self._phase))

    def _collect(self) -> None:
        if self._watch is not None:
            self._collect_import(self._watch)
            return
        pending, self._pending = self._pending, []
        for compile_id, trigger, stack, phase in pending:
            self.report(describe_compile(compile_id, trigger), stack=stack, phase=phase)
        compiled = self._frames() - self._before
        if compiled > 0 and not pending:
            self.report(
                f"dynamo compiled {compiled} frame(s) in the window that no callback reported "
                "(frames.total counter)",
                stack="",
            )

    def _collect_import(self, watch: _ImportWatch) -> None:
        """Dynamo was not imported when the window opened: was it imported inside?"""
        if DYNAMO not in sys.modules and watch.seen is None:
            return
        stack, phase = watch.seen or ("", self._phase)
        self.report(
            "torch._dynamo imported inside the capture window: torch.compile set up lazily "
            "(nothing imported it before capture)",
            stack=stack,
            phase=phase,
        )
        compiled = self._frames() if DYNAMO in sys.modules else 0
        if compiled > 0:
            self.report(
                f"dynamo compiled {compiled} frame(s) in the window after importing it there "
                "(frames.total counter)",
                stack=stack,
                phase=phase,
            )
