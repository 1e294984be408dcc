"""What one spawned rank checks on a real Kimi-K3 tree (tests/compat/test_real_trees.py).

Everything a rank sees is returned as plain JSON values so the test process can assert on it.
"""

from __future__ import annotations

import gc
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def _warm_and_capture(tree: Any, calls: Any, impl: str) -> dict[str, Any]:
    from harness.capture.callsites import CallSiteRouter, RealDecodeStep, call_sites
    from harness.capture.check import default_detectors
    from harness.capture.window import CaptureWindow
    from harness.transport.registry import TransportRegistry
    from harness.warm.impls import resolve_warm_impl
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
            static_forward_context=tree.static_forward_context,
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


def run_rank_checks(rank: int, world: int, store: Path, skip: frozenset[str]) -> dict[str, Any]:
    from harness.capture.callsites import watch_managers
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
            tree = build_real(RealSpec("kimi-k3", tp=world, dcp=world), skip_shims=skip)
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
        )
        result["vendored"] = _warm_and_capture(tree, calls, "vendored")
        result["before_kimi"] = _warm_and_capture(tree, calls, "before-kimi")
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
    finally:
        gc.collect()
        dist.destroy_process_group()
    return result
