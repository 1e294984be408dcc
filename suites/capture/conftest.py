"""Shared setup of the capture suite: build, warm and step one model at the run's geometry.

Geometry: tp and dcp come from the `qualification` fixture (the rank plan, else tp=16
and dcp = min(world size, 16)), so 16 ranks qualify Kimi-K3 TP16/DCP16 (96 heads x 576 -> 512),
4 ranks TP16/DCP4 (24 heads) and 2 ranks TP16/DCP2 (12 heads): the same six local Kimi heads
per rank, a real DCP group at every size. Models stay small (few layers, batch 2, max_tokens 8)
so 16 gloo ranks on 2 cores finish the suite in well under two minutes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch.distributed as dist

from harness.capture.check import default_detectors
from harness.capture.contrasts import contrast_keys
from harness.capture.decode import DecodeStep
from harness.capture.detector import Detector
from harness.capture.offrank import OFF_RANK, ControlOutcome, OffRankControls
from harness.core.capacity import RuntimeCapacity
from harness.core.signature import TransportSignature
from harness.models.builders import CONTRASTS, BuiltModel, build, build_contrasts
from harness.models.warm_impls import resolve_warm_impl
from harness.transport.registry import TransportRegistry, stand_in_registry
from harness.warm.recognizers import WarmContext
from harness.warm.warmup import WarmReport

# Few layers, every kind kept: Kimi-K3 has MLA on layers 3 and 7 (KDA elsewhere) plus the MTP
# head's re-reference; the mixed model cycles Kimi, DeepSeek-V4 and generic MLA.
NUM_LAYERS = {"kimi-k3": 8, "deepseek-v4": 2, "generic-mla": 2, "mixed": 12}
MAX_TOKENS = 8
DTYPE = "bf16"


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Negative controls before the capture checks, every rank alike.

    `dcpqual run` stops at the first failed test. Under a broken warmup (`--warm-impl
    before-kimi`) the Kimi-K3 capture check fails by design; the controls must have run by then
    so the evidence still shows every detector firing. The controls run off the ranks (see
    `off_rank`) come last among the controls, so their child process has the most time to
    finish in the background. Items of other suites keep their places.
    """
    here = [i for i, item in enumerate(items) if item.nodeid.startswith("suites/capture/")]
    mine = [items[i] for i in here]
    ordered = sorted(mine, key=_place)
    for index, item in zip(here, ordered, strict=True):
        items[index] = item


def _off_rank_detector(nodeid: str) -> str | None:
    return next((d for d in OFF_RANK if f"::test_detector_control[{d}]" in nodeid), None)


def _place(item: pytest.Item) -> int:
    if "test_negative_controls.py" not in item.nodeid:
        return 2
    return 1 if _off_rank_detector(item.nodeid) else 0


# The child processes of the controls run off the ranks, started by the lowest rank only.
_OFF_RANK: dict[str, OffRankControls] = {}
OFF_RANK_TIMEOUT_S = 600.0


def _start_off_rank(detector: str) -> OffRankControls:
    if detector not in _OFF_RANK:
        cuda = dist.get_backend() == "nccl"
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu"
        _OFF_RANK[detector] = OffRankControls.start(
            detector, device=device, rank=dist.get_rank(), world_size=dist.get_world_size()
        )
    return _OFF_RANK[detector]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the off-rank controls in the background as soon as the lowest rank knows it will
    run them (the rank plugin joined the process group before collection)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() != 0:
        return
    for detector in dict.fromkeys(
        filter(None, map(_off_rank_detector, (i.nodeid for i in session.items)))
    ):
        _start_off_rank(detector)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for controls in _OFF_RANK.values():
        controls.close()
    _OFF_RANK.clear()


@pytest.fixture
def off_rank(world) -> Callable[[str, str], ControlOutcome | None]:
    """`off_rank(detector, variant)`: the lowest rank's outcome of one control variant run in
    its child process (`harness.capture.offrank`); None on every other rank, which runs no
    window of its own for that control."""

    def outcome(detector: str, variant: str) -> ControlOutcome | None:
        if world.rank != 0:
            return None
        return _start_off_rank(detector).outcomes(OFF_RANK_TIMEOUT_S)[variant]

    return outcome


@dataclass
class Prepared:
    """One model, warmed by one warm implementation, with its decode step."""

    model: str
    built: BuiltModel
    registry: TransportRegistry
    context: WarmContext
    report: WarmReport
    step: DecodeStep
    warm_impl: str

    def detectors(self) -> list[Detector]:
        return default_detectors(self.registry, device=self.registry.device)


@pytest.fixture
def contrast_keys_here(world, contrast) -> dict[str, TransportSignature]:
    """The contrast tree's keys (`harness.capture.contrasts.contrast_keys`) as `prepare` builds
    and warms it on the `contrast` DCP group."""
    return contrast_keys(
        contrast.dcp, dtype=DTYPE, max_tokens=MAX_TOKENS, device_type=world.device.type
    )


@pytest.fixture
def prepare(world, qualification) -> Iterator[Callable[..., Prepared]]:
    """`prepare(model, warm_impl, geometry=None, *, max_num_batched_tokens=, runtime=)`: build
    at the run's geometry (or the given `Qualification` of suites/conftest.py, e.g.
    `held_out`) with the runtime's token cap (default: this environment's), warm, make the
    decode step. `model` "contrasts" is the contrast tree (`contrast`'s DCP group)."""
    registries: list[TransportRegistry] = []

    def make(
        model: str,
        warm_impl: str,
        geometry: Any = None,
        *,
        max_num_batched_tokens: int = MAX_TOKENS,
        runtime: RuntimeCapacity | None = None,
    ) -> Prepared:
        where = geometry or qualification
        # The fork's runtime token cap; VLLM_DCP_A2A_MAX_TOKENS reaches it as in production.
        capacity = runtime if runtime is not None else RuntimeCapacity.from_env()
        if model == CONTRASTS:
            built = build_contrasts(
                dcp=where.dcp,
                dtype=DTYPE,
                max_num_batched_tokens=max_num_batched_tokens,
                runtime_capacity=capacity,
            )
        else:
            built = build(
                model,
                tp=where.tp,
                dcp=where.dcp,
                num_layers=NUM_LAYERS[model],
                dtype=DTYPE,
                max_num_batched_tokens=max_num_batched_tokens,
                runtime_capacity=capacity,
            )
        # What production warmup reads from the engine config (not from the layers).
        context = WarmContext(
            dtype=DTYPE,
            max_tokens=max_num_batched_tokens,
            device_type=world.device.type,
            dcp_world_size=where.dcp,
        )
        registry = stand_in_registry(world.device, where.dcp)
        registries.append(registry)
        impl = resolve_warm_impl(warm_impl)
        report = impl.fn(
            built.model,
            registry=registry,
            context=context,
            group=where.dcp_group,
            static_forward_context=built.static_forward_context,
        )
        step = DecodeStep(built, registry=registry, group=where.dcp_group)
        return Prepared(model, built, registry, context, report, step, impl.name)

    yield make
    for registry in registries:
        registry.close()
