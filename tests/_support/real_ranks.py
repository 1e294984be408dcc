"""What one spawned rank checks on a real Kimi-K3 tree (tests/compat/test_real_trees.py).

Everything a rank sees is returned as plain JSON values so the test process can assert on it.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def _warm_and_capture(
    tree: Any, calls: Any, impl: str, *, modules_only: bool = False
) -> dict[str, Any]:
    from harness.capture.callsites import CallSiteRouter, RealDecodeStep, call_sites
    from harness.capture.check import default_detectors
    from harness.capture.window import CaptureWindow
    from harness.models.warm_impls import resolve_warm_impl
    from harness.transport.registry import TransportRegistry
    from harness.warm.recognizers import WarmContext

    sites = call_sites(tree.static_forward_context, calls)
    config = tree.vllm_config
    context = WarmContext(
        dtype="bf16",
        max_tokens=config.scheduler_config.max_num_batched_tokens,
        dcp_world_size=config.parallel_config.decode_context_parallel_size,
    )
    with TransportRegistry("torch", strategy=tree.spec.dcp_comm_backend) as registry:
        report = resolve_warm_impl(impl).fn(
            tree.target,
            registry=registry,
            context=context,
            group=tree.dcp_group,
            static_forward_context=None if modules_only else tree.static_forward_context,
        )
        warmed = [s.describe() for s in registry.signatures()]
        step = RealDecodeStep(sites, rank=dist.get_rank())
        window = CaptureWindow(default_detectors(registry), registry=registry, mode="record")
        with CallSiteRouter(sites, registry, tree.dcp_group) as router:
            captured = window.capture(step, step.make_inputs(seed=1))
            matches = False
            if not captured.error:
                fresh = step.make_inputs(seed=2)
                replayed = captured.replay(fresh)
                eager = step(fresh)
                matches = all(torch.equal(a, b) for a, b in zip(replayed, eager, strict=True))
        return {
            "report": [s.describe() for s in report.signatures],
            "warmed": warmed,
            "used": [s.describe() for s in sorted(router.served)],
            "keys": [k.describe() for k in sorted(router.used)],
            "events": [e.what for e in window.events],
            "detectors": sorted({e.detector for e in window.events}),
            "lazy": [e.signature.describe() for e in window.events if e.signature is not None],
            "replay_matches_eager": matches,
        }


def _exact_warm_and_capture(tree: Any, calls: Any, *, skip_draft: bool) -> dict[str, Any]:
    """`warm_exactly` over every layer or, with `skip_draft`, over the target's own modules
    only; then one captured decode step."""
    from harness.capture.callsites import CallSiteRouter, RealDecodeStep, call_sites, warm_exactly
    from harness.capture.check import default_detectors
    from harness.capture.window import CaptureWindow
    from harness.transport.registry import TransportRegistry

    sites = call_sites(tree.static_forward_context, calls)
    skip = frozenset(tree.draft_layers) if skip_draft else frozenset()
    with TransportRegistry("torch", strategy=tree.spec.dcp_comm_backend) as registry:
        warm_exactly(sites, registry, tree.dcp_group, skip=skip)
        warmed = [s.describe() for s in registry.signatures()]
        step = RealDecodeStep(sites, rank=dist.get_rank())
        window = CaptureWindow(default_detectors(registry), registry=registry, mode="record")
        with CallSiteRouter(sites, registry, tree.dcp_group):
            window.capture(step, step.make_inputs(seed=3))
        return {
            "warmed": warmed,
            "lazy": [e.signature.describe() for e in window.events if e.signature is not None],
        }


def rebuild_target_without(tree: Any, shim: str) -> dict[str, Any]:
    """The same target built again in this rank's parallel state with `shim` left out (a fresh
    forward context, so layer names do not clash): what each generic layer then has."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    from harness.models.real.configs import TINY_CONFIGS
    from harness.models.real.shims import SHIMS, applied
    from harness.warm.discovery import discover
    from harness.warm.recognizers import WarmContext, recognizer_set

    config = tree.vllm_config
    compilation = config.compilation_config
    saved = compilation.static_forward_context
    compilation.static_forward_context = {}
    folder = Path(tempfile.mkdtemp(prefix="dcpqual-real-rebuild-"))
    try:
        TINY_CONFIGS[tree.spec.model]().write(folder)
        with (
            applied(SHIMS, model=tree.spec.model, skip=frozenset({shim})),
            set_current_vllm_config(config),
            set_default_torch_dtype(config.model_config.dtype),
        ):
            target = initialize_model(vllm_config=config)
        layers = dict(compilation.static_forward_context)
    finally:
        compilation.static_forward_context = saved
        shutil.rmtree(folder, ignore_errors=True)
    context = WarmContext(
        max_tokens=config.scheduler_config.max_num_batched_tokens,
        dcp_world_size=config.parallel_config.decode_context_parallel_size,
        comm_backend=tree.spec.dcp_comm_backend,
    )
    found = discover(
        target,
        context=context,
        recognizers=recognizer_set("vendored"),
        static_forward_context=layers,
    )
    return {
        "managers": [getattr(m, "dcp_manager", None) is not None for m in layers.values()],
        "backends": [m.attn_backend.get_name() for m in layers.values()],
        "gates": [getattr(m, "dcp_b12x", None) for m in layers.values()],
        "recognized": [s.describe() for s in found.signatures],
    }


def run_rank_checks(
    rank: int,
    world: int,
    store: Path,
    skip: frozenset[str],
    *,
    model: str = "kimi-k3",
    comm_backend: str = "ag_rs",
    rebuild_without: tuple[str, ...] = (),
    draft_kv_cache_dtype: str | None = None,
) -> dict[str, Any]:
    from harness.capture.callsites import call_sites, watch_managers
    from harness.models.real import RealSpec, build_real

    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    result: dict[str, Any] = {"built": False}
    try:
        with watch_managers() as calls:
            spec = RealSpec(
                model,
                tp=world,
                dcp=world,
                dcp_comm_backend=comm_backend,
                draft_kv_cache_dtype=draft_kv_cache_dtype,
            )
            tree = build_real(spec, skip_shims=skip)
        target_ids = {id(m) for m in tree.target.modules()}
        result.update(
            built=True,
            build_s=tree.build_s,
            classes=list(tree.attention_classes),
            context=list(tree.static_forward_context),
            draft_layers=list(tree.draft_layers),
            draft_in_target_modules=any(
                id(tree.static_forward_context[n]) in target_ids for n in tree.draft_layers
            ),
            shims=[s.name for s in tree.shims],
            calls=[vars(c) for c in calls.values()],
            draft_calls=[
                vars(calls[id(tree.static_forward_context[n].dcp_manager)])
                for n in tree.draft_layers
            ],
            gates=[getattr(m, "dcp_b12x", None) for m in tree.static_forward_context.values()],
            backends=[m.attn_backend.get_name() for m in tree.static_forward_context.values()],
            sites=[s.name for s in call_sites(tree.static_forward_context, calls)],
            limitations=list(tree.limitations()),
        )
        for shim in rebuild_without:
            result.setdefault("without", {})[shim] = rebuild_target_without(tree, shim)
        if not result["sites"]:
            return result
        result["vendored"] = _warm_and_capture(tree, calls, "vendored")
        result["before_kimi"] = _warm_and_capture(tree, calls, "before-kimi")
        if tree.draft is not None:
            result["modules_only"] = _warm_and_capture(tree, calls, "vendored", modules_only=True)
            result["exact"] = _exact_warm_and_capture(tree, calls, skip_draft=False)
            result["exact_modules_only"] = _exact_warm_and_capture(tree, calls, skip_draft=True)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
    finally:
        gc.collect()
        dist.destroy_process_group()
    result["cpu_shm_ops"] = cpu_shm_ops()
    return result


def cpu_shm_ops() -> bool:
    """Whether vLLM's CPU build registered its shared-memory communicator's ops here: vLLM's
    CpuCommunicator reads VLLM_DIST_IDENT (and starts SHM segments) only where it did. Its
    AVX-512 build has them; the build vLLM loads on a CPU without AVX-512 may not."""
    return hasattr(torch.ops._C, "init_shm_manager")
