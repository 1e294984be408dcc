"""The b12x transport's call order against b12x 1.5.1's own pool (see tests/_support/b12x_sim.py).

The real `PCIeDCPA2APool` decides here, with its own errors, whether our order is one b12x takes:
an eager channel bound to the creating stream, a graph channel entered with `pool.capture(side)`
before the window's side-stream warm-up and its capture, plans prepared before capture on the
channel that runs them. The negative controls are the orders b12x refuses, each failing with
b12x's message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from harness.capture.window import CUDA_GRAPH, CaptureWindow
from harness.core.signature import TransportSignature
from harness.transport import b12x_backend as bb
from harness.transport.registry import enter_capture_scopes
from tests._support import b12x_sim as sim  # skips this module where b12x is absent

pytestmark = pytest.mark.compat

SMALL = TransportSignature("bf16", 8, 24, 16, 2, max_tokens=4, device_type="cuda")
META = {"device": "meta", "dtype": torch.bfloat16}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> sim.SimWorld:
    w = sim.SimWorld(cuda=sim.SimCuda(), world_size=SMALL.dcp_world_size)
    sim.install(monkeypatch, w)
    return w


def make(world: sim.SimWorld, prepared: list[tuple[str, str]] | None = None):
    alloc = sim.MetaAllocator()
    t = bb.B12xDCPTransport(SMALL, object(), allocator=alloc, api=sim.sim_api(world, prepared))
    return t, alloc


def step_through(t: bb.B12xDCPTransport):
    def step(inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        t.gather_queries(torch.empty(2, SMALL.local_heads, SMALL.query_head_dim, **META))
        t.reduce_outputs(
            torch.empty(2, SMALL.total_heads, SMALL.output_head_dim, **META),
            torch.empty(2, SMALL.total_heads, device="meta", dtype=torch.float32),
        )
        return inputs[0] * 2

    return step


class Registry:
    """What the window needs of a registry, over held transports (as `TransportRegistry`)."""

    def __init__(self, *transports: Any, scoped: bool = True) -> None:
        self.transports = transports
        if scoped:
            self.capture_scope = self._scope

    def frozen(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _scope(self, stream: Any) -> Iterator[None]:
        with enter_capture_scopes(self.transports, stream):
            yield


def test_creation_prepares_the_eager_channel_and_the_first_graph_id(world):
    prepared: list[tuple[str, str]] = []
    t, alloc = make(world, prepared)
    pool = t.pool
    assert isinstance(pool, sim.pcie.PCIeDCPA2APool)  # b12x's own class
    assert sorted(pool._logical_channels) == [bb.EAGER_CHANNEL_ID, bb.graph_channel_id(0)]
    eager = pool._logical_channels[bb.EAGER_CHANNEL_ID]
    assert t.eager.channel is eager and eager._owner_stream_key == world.cuda.default.cuda_stream
    assert prepared == [
        (eager.name, bb.GATHER_SURFACE),
        (eager.name, bb.REDUCE_SURFACE),
        (eager.name, bb.REDUCE_SURFACE),
    ]
    assert [n for n, _ in alloc.external] == ["b12x_ipc_slab_eager", "b12x_ipc_slab_graph"]


def test_the_window_runs_warmup_and_capture_on_the_graph_channel(world):
    prepared: list[tuple[str, str]] = []
    t, _ = make(world, prepared)
    step = step_through(t)
    step((torch.ones(3),))  # eager, before the window
    window = CaptureWindow(registry=Registry(t), path=CUDA_GRAPH, cuda=world.cuda)
    captured = window.capture(step, torch.ones(3))
    step((torch.ones(3),))  # eager again, after it
    graph = world.channels[1]
    assert graph is t.pool._logical_channels[bb.graph_channel_id(0)]
    # plans for the graph channel were prepared on its stream, before any capture
    assert prepared[3:] == [(graph.name, bb.GATHER_SURFACE), *[(graph.name, bb.REDUCE_SURFACE)] * 2]
    runs = [(ch, stream, capturing) for ch, _, stream, capturing in world.log]
    assert runs == [
        *[("channel0", "default", False)] * 2,
        *[("channel1", "side", False)] * 6,  # three warm-up iterations, on the side stream
        *[("channel1", "side", True)] * 2,  # the capture
        *[("channel0", "default", False)] * 2,
    ]
    assert graph._device_slot_selection and not world.channels[0]._device_slot_selection
    assert captured.path == CUDA_GRAPH and t.captures == 1


def test_each_capture_gets_its_own_graph_channel(world):
    t, alloc = make(world)
    for _ in range(2):
        CaptureWindow(registry=Registry(t), path=CUDA_GRAPH, cuda=world.cuda).capture(
            step_through(t), torch.ones(3)
        )
    assert sorted(t.pool._captured_channel_ids) == [bb.graph_channel_id(0), bb.graph_channel_id(1)]
    assert len(world.channels) == 3
    assert [n for n, _ in alloc.external][-1] == "b12x_ipc_slab_graph"  # the second graph's
    assert len(alloc.external) == 3


# -- the orders b12x refuses ------------------------------------------------------------------


def test_a_window_that_enters_no_capture_scope_fails_on_the_side_stream(world):
    t, _ = make(world)
    window = CaptureWindow(registry=Registry(t, scoped=False), path=CUDA_GRAPH, cuda=world.cuda)
    with pytest.raises(RuntimeError, match="use a separate channel for each CUDA stream"):
        window.capture(step_through(t), torch.ones(3))


def test_a_capture_without_the_pool_context_is_refused(world):
    t, _ = make(world)
    window = CaptureWindow(
        registry=Registry(t, scoped=False), path=CUDA_GRAPH, cuda=world.cuda, warmup_iters=0
    )
    with pytest.raises(RuntimeError, match=r"requires an active pool.capture\(\)"):
        window.capture(step_through(t), torch.ones(3))


def test_entering_the_scope_after_capture_began_is_refused(world):
    t, _ = make(world)
    side = world.cuda.Stream()
    graph = world.cuda.graph(world.cuda.CUDAGraph(), stream=side, capture_error_mode="global")
    refused = pytest.raises(RuntimeError, match="must be entered before CUDA graph capture")
    with graph, refused, t.capture_scope(side):
        pass


def test_binding_the_eager_channel_to_a_second_stream_is_refused(world):
    t, _ = make(world)
    refused = pytest.raises(RuntimeError, match="stream-affine")
    with world.cuda.stream(world.cuda.Stream()), refused:
        step_through(t)((torch.ones(3),))


def test_a_plan_from_the_eager_channel_cannot_serve_the_graph_channel(world):
    t, _ = make(world)
    side = world.cuda.Stream()
    with t.capture_scope(side), world.cuda.stream(side):
        q = torch.empty(1, SMALL.local_heads, SMALL.query_head_dim, **META)
        with pytest.raises(ValueError, match="different channel owner"):
            t.pool.all_gather_heads(**bb.gather_kwargs(q, plan=t.eager.gather))


def test_the_same_graph_id_cannot_be_captured_twice(world):
    t, _ = make(world)
    side = world.cuda.Stream()
    with t.pool.capture(side, channel_id=bb.graph_channel_id(0)):
        pass
    refused = pytest.raises(RuntimeError, match="already captured")
    with refused, t.pool.capture(side, channel_id=bb.graph_channel_id(0)):
        pass
