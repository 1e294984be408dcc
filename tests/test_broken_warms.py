"""The deliberately wrong warms (`harness.capture.broken_warms`) are caught where they should be,
and only there: on 4 spawned gloo ranks, the Kimi-K3 stand-in warmed and captured in a strict
window at TP16/DCP2 (the DCP group a proper subgroup, tp != dcp) and at TP4/DCP4 (the DCP group
is the world and tp == dcp, the shape of TP16/DCP16).

- vendored: no lazy event in either geometry;
- gather-only: the reduction's first use inside capture, in both geometries;
- local heads as num_heads // dcp: a registry miss for the real signature at DCP2, nothing at
  tp == dcp (the blind spot a TP16/DCP4 pass in cpu16 closes);
- DCP group ignored: the registry refuses the world group at DCP2, nothing when it is the world.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _support.gloo_spawn import gloo_group, spawn

from harness.capture.broken_warms import BROKEN_WARMS
from harness.capture.check import default_detectors
from harness.capture.decode import DecodeStep
from harness.capture.events import LazySpecializationError
from harness.capture.window import CaptureWindow
from harness.errors import GeometryError
from harness.models.builders import build
from harness.transport.registry import TransportRegistry
from harness.warm.recognizers import WarmContext
from harness.warm.warmup import warm

WORLD = 4
# The warm-code mistakes are judged on the contrast tree (tests/test_contrast_tree.py).
GEOMETRY_MISTAKES = ("gather-only", "local-heads-by-dcp", "ignores-dcp-group")
IMPLS = {"vendored": warm, **{name: BROKEN_WARMS[name] for name in GEOMETRY_MISTAKES}}


def _outcome(impl: str, tp: int, dcp: int, group: dist.ProcessGroup) -> str:
    """'clean', 'refused' (warm raised GeometryError) or the first lazy event's text."""
    built = build("kimi-k3", tp=tp, dcp=dcp, num_layers=8, max_num_batched_tokens=8)
    context = WarmContext(dtype="bf16", max_tokens=8, device_type="cpu", dcp_world_size=dcp)
    with TransportRegistry("torch") as registry:
        try:
            IMPLS[impl](
                built.model,
                registry=registry,
                context=context,
                group=group,
                static_forward_context=built.static_forward_context,
            )
        except GeometryError:
            return "refused"
        step = DecodeStep(built, registry=registry, group=group)
        window = CaptureWindow(default_detectors(registry), registry=registry, mode="strict")
        try:
            window.capture(step, step.make_inputs(seed=1))
        except LazySpecializationError as exc:
            return f"{exc.event.what} [{exc.event.signature.describe()}]"
        return "clean"


def _every_impl(rank: int, world: int, store: str) -> None:
    with gloo_group(rank, world, store):
        pairs, _ = dist.new_subgroups(group_size=2)
        found = {}
        for impl in IMPLS:
            found[impl, "dcp2"] = _outcome(impl, 16, 2, pairs)
            found[impl, "dcp=world"] = _outcome(impl, WORLD, WORLD, dist.group.WORLD)
        dist.barrier()
        # 6 local Kimi heads x 2 at TP16/DCP2; 96 // 4 = 24 local heads x 4 at TP4/DCP4.
        assert found["vendored", "dcp2"] == "clean", found
        assert found["vendored", "dcp=world"] == "clean", found
        for where, heads in (("dcp2", 12), ("dcp=world", 96)):
            text = found["gather-only", where]
            assert text.startswith("first use of reduce with bfloat16 inside capture"), found
            assert f"{heads} heads x 576 -> 512" in text, found
        text = found["local-heads-by-dcp", "dcp2"]
        assert text.startswith("registry miss") and "12 heads x 576 -> 512" in text, found
        assert found["local-heads-by-dcp", "dcp=world"] == "clean", found
        assert found["ignores-dcp-group", "dcp2"] == "refused", found
        assert found["ignores-dcp-group", "dcp=world"] == "clean", found


@pytest.mark.slow
def test_each_broken_warm_is_caught_where_the_dcp_group_is_a_proper_subgroup() -> None:
    torch.set_num_threads(1)
    spawn(_every_impl, world=WORLD)
