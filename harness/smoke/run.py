"""Run the smoke in this process: a one-rank process group, warm, capture, replay, controls.

1. `world_of_one`: NCCL (gloo on CPU) over an in-process store, rank 0 of 1; destroyed at the end.
2. The stand-in Kimi-K3 (TP16/DCP16) is warmed by the vendored warm code through
   `World1Registry`; the decode step is captured in a strict window with every detector that
   can run here (a real `torch.cuda.graph` on a CUDA device), then replayed with fresh inputs
   and compared with the eager step and the independent reference.
3. The negative controls, each in its own registry and window, with no warm-up iterations so
   the lazy work lands in the capture itself: a device allocation kept in the default pool
   (`cuda-memory`), a Triton kernel first compiled inside the window (`triton-jit`), a new
   process group (`process-groups`), all in record mode; and the seed bug (the warm code from
   before the Kimi-K3 recognizer, so the step finds no transport and goes to create one) in
   strict mode, which must stop at the registry miss (`transport-registry`) before anything is
   created inside the capture.

Every failure becomes part of the result (an error text, a control that did not run), so a run
that got this far always leaves a bundle. Detectors and the three library controls are
injectable: the CPU tests drive this module with fakes where the hardware is needed.
"""

from __future__ import annotations

import gc
import platform
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from importlib import metadata

import torch
import torch.distributed as dist

from harness.capture.check import default_detectors, first_mismatch, signature_uses
from harness.capture.controls import (
    ControlContext,
    CudaMemoryControl,
    NegativeControl,
    NewGroupControl,
    TritonJitControl,
)
from harness.capture.detector import Detector
from harness.capture.window import CPU_SIMULATED, CUDA_GRAPH, CaptureWindow
from harness.core.signature import TransportSignature
from harness.errors import UsageError
from harness.models.builders import build
from harness.models.warm_impls import resolve_warm_impl
from harness.schema.capture import DetectorStatus
from harness.schema.smoke import (
    SMOKE_MODEL,
    CaptureOutcome,
    ControlOutcome,
    SmokeMachine,
    SmokeResult,
    SmokeUse,
)
from harness.smoke.step import (
    DTYPE,
    MAX_TOKENS,
    NUM_LAYERS,
    PRODUCTION_DCP,
    PRODUCTION_TP,
    SmokeStep,
    World1Registry,
    smoke_layers,
)
from harness.transport.registry import TransportRegistry, transports_used
from harness.warm.recognizers import WarmContext

DetectorFactory = Callable[[TransportRegistry, torch.device], list[Detector]]
ControlFactory = Callable[[ControlContext], NegativeControl]

# The library controls, in the order they run; the transport-registry control comes last.
LIBRARY_CONTROLS: dict[str, ControlFactory] = {
    "cuda-memory": CudaMemoryControl,
    "triton-jit": TritonJitControl,
    "process-groups": NewGroupControl,
}
SEED_BUG_IMPL = "before-kimi"
CAPTURE_SEED = 10
CONTROL_SEED = 20
REPLAY_SEEDS = (11, 12)
# Replay against eager: the same kernels on the same inputs.
EAGER_TOLERANCE = {"rtol": 1.6e-2, "atol": 1e-5}
# Against the fp32 reference: the partials are rounded to bf16 before the reduction.
REFERENCE_TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}


@dataclass(frozen=True)
class SmokeConfig:
    device: str = "cuda"
    batch: int = 2
    kv_tokens: int = 16
    replay_seeds: tuple[int, ...] = REPLAY_SEEDS
    warm_impl: str = "vendored"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def machine_facts(device: torch.device, backend: str) -> SmokeMachine:
    """What the smoke runs on; torch is whatever is installed (its version is recorded)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, capability = props.name, (int(props.major), int(props.minor))
    else:
        name, capability = platform.processor() or platform.machine() or "cpu", None
    return SmokeMachine(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        device=str(device),
        device_name=name,
        capability=capability,
        triton=_version("triton"),
        b12x=_version("b12x"),
        backend=backend,
    )


@contextmanager
def world_of_one(backend: str) -> Iterator[None]:
    """The default process group of this one process (rank 0 of 1), destroyed on the way out."""
    if dist.is_initialized():
        raise UsageError(
            "the smoke runs its own one-rank process group, and this process already has one"
        )
    dist.init_process_group(
        backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=120)
    )
    try:
        yield
    finally:
        gc.collect()  # tracebacks that hold the group go first
        dist.destroy_process_group()


def indexed(device: torch.device, current: Callable[[], int]) -> torch.device:
    """`cuda` -> `cuda:<current device>` (set_device and NCCL want an index); others as given."""
    index: int | None = device.index  # None for a bare "cuda" (torch's stubs say int)
    if device.type != "cuda" or index is not None:
        return device
    return torch.device("cuda", current())


def _path_for(device: torch.device) -> str:
    return CUDA_GRAPH if device.type == "cuda" else CPU_SIMULATED


@dataclass
class _Warmed:
    registry: TransportRegistry
    step: SmokeStep
    discovered: tuple[TransportSignature, ...]


def _warm(config: SmokeConfig, device: torch.device, warm_impl: str) -> _Warmed:
    """Build the stand-in, warm it through the world-1 view, and make the step."""
    built = build(SMOKE_MODEL, tp=PRODUCTION_TP, dcp=PRODUCTION_DCP, num_layers=NUM_LAYERS)
    context = WarmContext(
        dtype=DTYPE, max_tokens=MAX_TOKENS, device_type=device.type, dcp_world_size=PRODUCTION_DCP
    )
    registry = TransportRegistry("torch", device=device)
    try:
        report = resolve_warm_impl(warm_impl).fn(
            built.model,
            registry=World1Registry(registry),
            context=context,
            group=None,
            static_forward_context=built.static_forward_context,
        )
        step = SmokeStep(
            smoke_layers(built),
            registry=registry,
            device=device,
            batch=config.batch,
            kv_tokens=config.kv_tokens,
        )
    except BaseException:
        registry.close()
        raise
    return _Warmed(registry, step, report.signatures)


def capture_step(
    warmed: _Warmed, config: SmokeConfig, detectors: DetectorFactory, device: torch.device
) -> CaptureOutcome:
    """Strict capture of the warmed step, replays with fresh inputs, the comparisons."""
    step, registry = warmed.step, warmed.registry
    window = CaptureWindow(detectors(registry, device), registry=registry, mode="strict")
    started = time.perf_counter()
    step.reset_used()
    used = step.expected_signatures()  # what the step asks for, if capture stops at the first
    expected = len(config.replay_seeds)

    def outcome(
        *,
        path: str | None = None,
        replays: int = 0,
        mismatches: tuple[str, ...] = (),
        error: str = "",
    ) -> CaptureOutcome:
        return CaptureOutcome(
            model=SMOKE_MODEL,
            path=_path_for(device) if path is None else path,
            expected_replays=expected,
            replays=replays,
            events=window.events,
            statuses=window.statuses,
            signatures=signature_uses(SMOKE_MODEL, registry.signatures(), used),
            mismatches=mismatches,
            error=error,
            duration_s=time.perf_counter() - started,
        )

    try:
        captured = window.capture(step, step.make_inputs(CAPTURE_SEED))
    except Exception as exc:  # a lazy event (strict) or a capture that broke
        return outcome(error=_error_text(exc))
    used = step.used_signatures
    mismatches = []
    try:
        for seed in config.replay_seeds:
            inputs = step.make_inputs(seed)
            replayed = captured.replay(inputs)
            for label, expected_out, tolerance in (
                ("eager", step(inputs), EAGER_TOLERANCE),
                ("reference", step.reference(seed), REFERENCE_TOLERANCE),
            ):
                mismatch = first_mismatch(replayed, expected_out, **tolerance)
                if mismatch:
                    mismatches.append(f"seed {seed} vs {label}: {mismatch}")
    except Exception as exc:
        return outcome(path=captured.path, replays=captured.replays, error=_error_text(exc))
    finally:
        captured.close()
    return outcome(path=captured.path, replays=captured.replays, mismatches=tuple(mismatches))


def _status_problem(
    found: list[Detector], name: str
) -> tuple[str | None, tuple[DetectorStatus, ...]]:
    statuses = tuple(d.status() for d in found)
    status = next((s for s in statuses if s.name == name), None)
    if status is None:
        return f"no detector named {name!r} in this window", statuses
    if not status.active:
        return f"{name} cannot run here: {status.reason}", statuses
    return None, statuses


def library_control(
    name: str, factory: ControlFactory, device: torch.device, detectors: DetectorFactory
) -> ControlOutcome:
    """One library control in record mode: provoke once inside a real capture."""
    started = time.perf_counter()
    with TransportRegistry("torch", device=device) as registry:
        found = detectors(registry, device)
        problem, statuses = _status_problem(found, name)
        if problem:
            return ControlOutcome(detector=name, ran=False, statuses=statuses, error=problem)
        control = factory(ControlContext(registry, device, rank=0, world_size=1))
        try:
            control.setup()
        except Exception as exc:
            why = f"its setup failed: {_error_text(exc)}"
            return ControlOutcome(detector=name, ran=False, statuses=statuses, error=why)
        window = CaptureWindow(found, registry=registry, mode="record", warmup_iters=0)

        def provoke(inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
            control.provoke()
            return inputs[0] * 2

        before = control.happened()
        path, error = _path_for(device), ""
        try:
            captured = window.capture(provoke, torch.ones(4, device=device))
        except Exception as exc:  # a broken capture with no lazy event seen
            error = _error_text(exc)
        else:
            path, error = captured.path, captured.error
            captured.close()
        return ControlOutcome(
            detector=name,
            ran=True,
            path=path,
            happened=control.happened() - before,
            events=window.events,
            statuses=window.statuses,
            error=error,
            duration_s=time.perf_counter() - started,
        )


def transport_control(
    config: SmokeConfig, device: torch.device, detectors: DetectorFactory
) -> ControlOutcome:
    """The seed bug inside a real capture: warmed by the code from before the Kimi-K3
    recognizer, the step misses its transport and would create it; strict mode must stop
    there. `happened` is the registry's own miss counter."""
    name = "transport-registry"
    started = time.perf_counter()
    try:
        warmed = _warm(config, device, SEED_BUG_IMPL)
    except Exception as exc:
        return ControlOutcome(detector=name, ran=False, error=f"warmup: {_error_text(exc)}")
    with warmed.registry as registry:
        found = detectors(registry, device)
        problem, statuses = _status_problem(found, name)
        if problem:
            return ControlOutcome(detector=name, ran=False, statuses=statuses, error=problem)
        window = CaptureWindow(found, registry=registry, mode="strict", warmup_iters=0)
        before = registry.counters.misses
        error = ""
        try:
            window.capture(warmed.step, warmed.step.make_inputs(CONTROL_SEED)).close()
        except Exception as exc:  # LazySpecializationError is the expected ending
            error = _error_text(exc)
        return ControlOutcome(
            detector=name,
            ran=True,
            path=_path_for(device),
            happened=registry.counters.misses - before,
            events=window.events,
            statuses=window.statuses,
            error=error,
            duration_s=time.perf_counter() - started,
        )


def run_smoke(
    config: SmokeConfig,
    *,
    detectors: DetectorFactory = lambda registry, device: default_detectors(
        registry, device=device
    ),
    controls: Mapping[str, ControlFactory] = LIBRARY_CONTROLS,
) -> SmokeResult:
    """The whole smoke in this process (see the module doc)."""
    device = indexed(torch.device(config.device), torch.cuda.current_device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    machine = machine_facts(device, backend)
    started_at = _now()
    discovered: tuple[TransportSignature, ...] = ()
    warmed_sigs: tuple[TransportSignature, ...] = ()
    capture = CaptureOutcome(
        model=SMOKE_MODEL, path=_path_for(device), expected_replays=len(config.replay_seeds)
    )
    outcomes: list[ControlOutcome] = []
    try:
        with world_of_one(backend):
            try:
                warmed = _warm(config, device, config.warm_impl)
            except Exception as exc:
                capture = replace(capture, error=f"warmup failed: {_error_text(exc)}")
            else:
                with warmed.registry:
                    discovered, warmed_sigs = warmed.discovered, warmed.registry.signatures()
                    capture = capture_step(warmed, config, detectors, device)
            for name, factory in controls.items():
                outcomes.append(library_control(name, factory, device, detectors))
            outcomes.append(transport_control(config, device, detectors))
    except UsageError:
        raise
    except Exception as exc:  # the process group itself: what ran so far is kept
        why = f"the one-rank {backend} process group failed: {_error_text(exc)}"
        capture = replace(capture, error="; ".join(filter(None, (capture.error, why))))
    return SmokeResult(
        machine=machine,
        capture=capture,
        controls=tuple(outcomes),
        discovered=discovered,
        warmed=warmed_sigs,
        started_at=started_at,
        finished_at=_now(),
        extra=SmokeUse(warm_impl=config.warm_impl, transports=tuple(transports_used())),
    )
