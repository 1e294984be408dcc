"""Detectors armed around vLLM's own startup phases, found through seams every era of the fork
keeps (never an era's private warm names):

- phases: the worker's `compile_or_warm_up_model` (vLLM's warm, whatever it holds) and the
  model runner's `capture_model` (wrapped on every loaded model-runner class that defines it,
  so the live engine's runner is covered whatever its class), and
  `vllm.distributed.parallel_state.graph_capture` (also where a module imported it by name);
  the lane itself marks `load` (before the warm) and `decode` (the generate calls);
- what is created: `torch.distributed.new_group` (a new process group / NCCL communicator),
  b12x's `DcpAllToAll` / `DcpAllToAllPool` constructors (a transport or pool), b12x's kernel
  resolution gate (`raise_if_kernel_resolution_frozen`, called on every new kernel it
  resolves) and Triton's JIT hook where Triton exists;
- what served the DCP calls: b12x's `all_gather_heads` / `lse_reduce_scatter`, and vLLM's DCP
  group coordinator's collectives (any DCP call that took another path).

Anything created during `capture` or `decode` is a lazy event with its phase, rank and stack.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

LAZY_PHASES = frozenset({"capture", "decode"})
PHASES: tuple[str, ...] = ("load", "warm", "capture", "decode")
B12X_CLASSES = ("DcpAllToAll", "DcpAllToAllPool")
B12X_CALLS = ("all_gather_heads", "lse_reduce_scatter")
DCP_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_gatherv", "reduce_scatterv")
_STACK_FRAMES = 8


@dataclass(frozen=True)
class Created:
    """One thing created while the watch was armed."""

    phase: str
    kind: str  # process-group | b12x-transport | kernel
    what: str
    stack: tuple[str, ...]

    @property
    def lazy(self) -> bool:
        return self.phase in LAZY_PHASES


def _stack() -> tuple[str, ...]:
    frames = traceback.extract_stack()[:-3][-_STACK_FRAMES:]
    return tuple(f"{f.filename}:{f.lineno} {f.name}" for f in frames)


@dataclass
class PhaseWatch:
    """The phase vLLM is in on this rank, what was created in each, and what served DCP."""

    phase: str = "load"
    created: list[Created] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    entered: Counter[str] = field(default_factory=Counter)
    graph_captures: int = 0
    served: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (class, call, phase)
    other_path: Counter[tuple[str, str]] = field(default_factory=Counter)  # (collective, phase)
    seams: dict[str, str] = field(default_factory=dict)  # seam -> "armed" or why not
    _undo: contextlib.ExitStack | None = None

    # -- phases -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def in_phase(self, name: str) -> Iterator[None]:
        """Attribute everything inside to phase `name` (nested: the inner one wins)."""
        outer, self.phase = self.phase, name
        self.entered[name] += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + spent
            if outer != name:  # the outer phase's time excludes the inner's
                self.seconds[outer] = self.seconds.get(outer, 0.0) - spent
            self.phase = outer

    def note(self, kind: str, what: str) -> None:
        self.created.append(Created(self.phase, kind, what, _stack()))

    def lazy(self) -> list[Created]:
        return [c for c in self.created if c.lazy]

    # -- arming ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def armed(self) -> Iterator[PhaseWatch]:
        """Patch every seam for the duration; each one restored on the way out."""
        with contextlib.ExitStack() as undo:
            self._undo = undo
            arms = [
                self._arm_new_group,
                self._arm_phases,
                self._arm_graph_capture,
                self._arm_triton,
                self._arm_dcp_group,
                self._arm_b12x,
                self._arm_b12x_kernels,
            ]
            with warnings.catch_warnings():  # what importing vLLM and b12x warns is theirs
                warnings.simplefilter("ignore")
                for arm in arms:
                    arm(undo)
            try:
                yield self
            finally:
                self._undo = None

    def _patch(self, undo: contextlib.ExitStack, owner: Any, name: str, new: Any) -> None:
        old = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, new)
        undo.callback(setattr, owner, name, old)

    def _arm_new_group(self, undo: contextlib.ExitStack) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        original = c10d.new_group
        watch = self

        @functools.wraps(original)
        def new_group(*args: Any, **kwargs: Any) -> Any:
            ranks = kwargs.get("ranks", args[0] if args else None)
            watch.note("process-group", f"torch.distributed.new_group(ranks={ranks})")
            return original(*args, **kwargs)

        self._patch(undo, c10d, "new_group", new_group)
        self._patch(undo, dist, "new_group", new_group)
        self.seams["torch.distributed.new_group"] = "armed"

    def _wrap_phase(self, undo: contextlib.ExitStack, cls: type, method: str, phase: str) -> None:
        original = cls.__dict__[method]
        watch = self

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with watch.in_phase(phase):
                return original(*args, **kwargs)

        self._patch(undo, cls, method, wrapped)

    def _arm_phases(self, undo: contextlib.ExitStack) -> None:
        """Every loaded worker class's warm and model-runner class's capture, found by the
        method name on the class hierarchy the installed vLLM defines."""
        try:
            from vllm.v1.worker.gpu_model_runner import GPUModelRunner
            from vllm.v1.worker.worker_base import WorkerBase
        except ImportError as exc:
            self.seams["capture_model"] = f"not armed: {exc}"
            return
        # The platform's own worker and runner modules (importing them registers the classes).
        for module in ("vllm.v1.worker.cpu_worker", "vllm.v1.worker.gpu_worker"):
            with contextlib.suppress(Exception):
                __import__(module)
        for cls in _subclasses(WorkerBase):
            if "compile_or_warm_up_model" in cls.__dict__:
                self._wrap_phase(undo, cls, "compile_or_warm_up_model", "warm")
        for cls in (GPUModelRunner, *_subclasses(GPUModelRunner)):
            if "capture_model" in cls.__dict__:
                self._wrap_phase(undo, cls, "capture_model", "capture")
        self.seams["capture_model"] = "armed"
        self.seams["compile_or_warm_up_model"] = "armed"

    def _arm_graph_capture(self, undo: contextlib.ExitStack) -> None:
        import vllm.distributed.parallel_state as ps

        original = ps.graph_capture
        watch = self

        @contextlib.contextmanager
        def graph_capture(*args: Any, **kwargs: Any) -> Iterator[Any]:
            watch.graph_captures += 1
            with watch.in_phase("capture"), original(*args, **kwargs) as context:
                yield context

        for module in list(sys.modules.values()):  # also where it was imported by name
            if getattr(module, "__name__", "").startswith("vllm") and (
                getattr(module, "graph_capture", None) is original
            ):
                self._patch(undo, module, "graph_capture", graph_capture)
        self.seams["vllm.distributed.parallel_state.graph_capture"] = "armed"

    def _arm_b12x(self, undo: contextlib.ExitStack) -> None:
        try:
            import b12x.comm.pcie.api as api
        except Exception as exc:  # absent, or its import fails on this platform
            self.seams["b12x"] = f"not armed: b12x.comm.pcie.api ({type(exc).__name__})"
            return
        watch = self
        for public in B12X_CLASSES:
            cls = getattr(api, public)
            init = cls.__dict__["__init__"]

            def constructed(*a: Any, _init: Any = init, _name: str = public, **k: Any) -> None:
                watch.note("b12x-transport", f"b12x.comm.pcie.api.{_name}()")
                _init(*a, **k)

            self._patch(undo, cls, "__init__", functools.wraps(init)(constructed))
            for call in B12X_CALLS:
                method = cls.__dict__[call]

                def served(
                    *a: Any, _m: Any = method, _key: tuple[str, str] = (public, call), **k: Any
                ) -> Any:
                    watch.served[(*_key, watch.phase)] += 1
                    return _m(*a, **k)

                self._patch(undo, cls, call, functools.wraps(method)(served))
        self.seams["b12x"] = "armed"

    def _arm_b12x_kernels(self, undo: contextlib.ExitStack) -> None:
        try:
            import b12x._lib.runtime_control as rc
        except Exception as exc:
            self.seams["b12x-kernels"] = f"not armed: ({type(exc).__name__})"
            return
        original = rc.raise_if_kernel_resolution_frozen
        watch = self

        @functools.wraps(original)
        def resolving(kind: str, *args: Any, **kwargs: Any) -> None:
            watch.note("kernel", f"b12x resolves {kind}")
            original(kind, *args, **kwargs)

        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("b12x") and (
                getattr(module, "raise_if_kernel_resolution_frozen", None) is original
            ):
                self._patch(undo, module, "raise_if_kernel_resolution_frozen", resolving)
        self.seams["b12x-kernels"] = "armed"

    def _arm_triton(self, undo: contextlib.ExitStack) -> None:
        """Triton's JIT hook, where a real Triton is installed (vLLM puts a placeholder module
        in its place when it is not, so the distribution is asked, not `import triton`)."""
        import importlib.metadata

        try:
            importlib.metadata.version("triton")
        except importlib.metadata.PackageNotFoundError:
            self.seams["triton"] = "not armed: triton is not installed"
            return
        import triton

        runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
            self.seams["triton"] = "not armed: no triton.knobs.runtime.jit_post_compile_hook"
            return
        previous = runtime.jit_post_compile_hook
        watch = self

        def compiled(*args: Any, **kwargs: Any) -> Any:
            fn = kwargs.get("fn")
            watch.note("kernel", f"triton JIT {getattr(fn, 'name', fn)}")
            return previous(*args, **kwargs) if previous else None

        runtime.jit_post_compile_hook = compiled
        undo.callback(setattr, runtime, "jit_post_compile_hook", previous)
        self.seams["triton"] = "armed"

    def _arm_dcp_group(self, undo: contextlib.ExitStack) -> None:
        """A DCP collective through vLLM's group coordinator (not a b12x object)."""
        from vllm.distributed.parallel_state import GroupCoordinator

        watch = self
        for name in DCP_COLLECTIVES:
            if name not in GroupCoordinator.__dict__:
                continue
            method = GroupCoordinator.__dict__[name]

            def collective(self_: Any, *a: Any, _m: Any = method, _n: str = name, **k: Any) -> Any:
                if str(getattr(self_, "unique_name", "")).startswith("dcp") and (
                    getattr(self_, "world_size", 1) > 1
                ):
                    watch.other_path[(_n, watch.phase)] += 1
                return _m(self_, *a, **k)

            self._patch(undo, GroupCoordinator, name, functools.wraps(method)(collective))
        self.seams["dcp-group-coordinator"] = "armed"


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    stack: list[type] = list(cls.__subclasses__())
    while stack:
        sub = stack.pop()
        if sub not in out:
            out.append(sub)
            stack.extend(sub.__subclasses__())
    return out


def hooked_once(
    target: Any, name: str, action: Callable[[], None]
) -> contextlib.AbstractContextManager[None]:
    """A test-only hook: `action` runs once, at the next call of `target.name` (vLLM's own
    call on a live object), then the attribute is what it was."""

    @contextlib.contextmanager
    def planted() -> Iterator[None]:
        had_own = name in vars(target)
        original = getattr(target, name)
        fired = False

        @functools.wraps(original)
        def once(*args: Any, **kwargs: Any) -> Any:
            nonlocal fired
            if not fired:
                fired = True
                action()
            return original(*args, **kwargs)

        setattr(target, name, once)
        try:
            yield
        finally:
            if had_own:
                setattr(target, name, original)
            else:
                delattr(target, name)

    return planted()
