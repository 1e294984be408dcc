"""The real b12x 1.5.1 `PCIeDCPA2APool` on a CPU machine, under a simulated CUDA stream world.

The pool class, its `for_stream`/`capture`/`prepare_channels` logic, and the channel's stream
rules (`PCIeDCPA2A._bind_stream_key` and `_check_stream`, borrowed unchanged) are b12x's own. Only
what needs a GPU or peers is replaced, in the `pcie_dcp_a2a` module's namespace: the current
stream and "is capturing" (from `SimCuda`), the device guard, the rank/world queries, the
collective setup helpers (one rank: every peer agrees), and the channel's constructor and kernels
(`SimChannel`, which records each call with the stream it ran on and refuses a plan prepared for
another channel, as b12x's `require_runtime` does). A wrong order of pool calls therefore fails
here with b12x's own error.

`SimCuda` (b12x-free, in `_support.cuda_sim`) is also the `torch.cuda` API a `CaptureWindow`
takes (`cuda=`): `graph(...)` turns capturing on for its body, and `stream(s)` makes `s` current.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pcie = pytest.importorskip(
    "b12x.comm.pcie.pcie_dcp_a2a",
    reason="b12x is not installed (nox -s compat installs b12x==1.5.1)",
    exc_type=ModuleNotFoundError,
)

from _support.cuda_sim import SimCuda, SimGraph, SimStream  # noqa: E402, F401 (sim.SimCuda)
from harness.transport import b12x_backend as bb  # noqa: E402

DEVICE = torch.device("cuda", 0)


@dataclass
class SimWorld:
    """One rank of a DCP group of `world_size`, with the log of every channel call."""

    cuda: SimCuda
    world_size: int
    rank: int = 0
    log: list[tuple[str, str, str, bool]] = field(default_factory=list)
    channels: list[Any] = field(default_factory=list)

    def stream_name(self, key: int | None) -> str:
        for s in (self.cuda.default, self.cuda.current):
            if s.cuda_stream == key:
                return s.name
        return f"stream:{key}"


def install(monkeypatch: pytest.MonkeyPatch, world: SimWorld) -> None:
    """Replace b12x's GPU- and peer-facing helpers (see the module doc); the pool stays real."""
    cuda = world.cuda

    def stream_key(device: Any, stream: Any = None) -> int:
        return int((cuda.current if stream is None else stream).cuda_stream)

    class SimChannel:
        _bind_stream_key = pcie.PCIeDCPA2A._bind_stream_key  # b12x's own affinity rule
        _check_stream = pcie.PCIeDCPA2A._check_stream

        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs
            self.device = DEVICE
            self.world_size, self.rank = world.world_size, world.rank
            self._stream_affine = bool(kwargs["stream_affine"])
            self._owner_stream_key: int | None = None
            self._device_slot_selection = False
            self.closed = False
            self.name = f"channel{len(world.channels)}"
            world.channels.append(self)

        @classmethod
        def from_exchange_group(cls, **kwargs: Any) -> SimChannel:
            return cls(**kwargs)

        def _prepared_state(self, plan: Any) -> None:
            if plan.runtime is not self:
                raise ValueError("DCP plan belongs to a different channel owner")

        def _run(self, op: str, plan: Any) -> None:
            self._prepared_state(plan)
            self._check_stream()
            if cuda.capturing:
                self._device_slot_selection = True
            world.log.append((self.name, op, cuda.current.name, cuda.capturing))

        def all_gather_heads(self, local_input: torch.Tensor, out: Any = None, **kw: Any) -> Any:
            self._run("gather", kw["plan"])
            return out

        def lse_reduce_scatter(self, partial: torch.Tensor, lse: Any, out: Any = None, **kw: Any):
            self._run("reduce", kw["plan"])
            return out

    def coordinated_close(channels: Any, *, exchange_group: Any, device: Any) -> None:
        for channel in channels:
            channel.closed = True

    fakes: Mapping[str, Any] = {
        "_current_stream_key": stream_key,
        "_is_current_stream_capturing": lambda device: cuda.capturing,
        "_device_guard": lambda device: contextlib.nullcontext(),
        "dist": SimpleNamespace(
            get_rank=lambda group=None: world.rank,
            get_world_size=lambda group=None: world.world_size,
        ),
        "_run_collective_preallocation_setup": lambda *, owner, exchange_group, setup: setup(),
        "_broadcast_gather_object": lambda obj, group: [obj] * world.world_size,
        "_collective_capture_needs_preparation": (
            lambda *, owner, logical_id, prepared_channel_ids, exchange_group: (
                logical_id not in prepared_channel_ids
            )
        ),
        "_require_collective_contract": lambda **_: None,
        "_require_full_grid_residency": lambda **_: None,
        "_coordinated_close_channels": coordinated_close,
        "PCIeDCPA2A": SimChannel,
    }
    for name, value in fakes.items():
        assert hasattr(pcie, name), f"b12x 1.5.1 has no pcie_dcp_a2a.{name} to stand in for"
        monkeypatch.setattr(pcie, name, value)


def sim_api(world: SimWorld, prepared: list[tuple[str, str]] | None = None) -> bb.B12xApi:
    """The adapter's b12x API with the real pool class; planning is recorded, and preparation
    primes the plan's channel on the current stream (as b12x's `prepare_default` runs a real
    call), refusing to do it during capture (cold work b12x forbids there)."""
    cuda = world.cuda
    seen = prepared if prepared is not None else []

    def query(runtime: Any, *, surface: str, call: Mapping[str, Any]) -> Any:
        return SimpleNamespace(surface=surface, runtime=runtime)

    def plan(query_: Any, *, runtime: Any) -> Any:
        return SimpleNamespace(query=query_, runtime=runtime)

    def prepare(plan_: Any, call: Mapping[str, Any]) -> None:
        if cuda.capturing:
            raise RuntimeError("plan is not prepared and kernel resolution is frozen")
        plan_.runtime._check_stream()
        seen.append((plan_.runtime.name, plan_.query.surface))

    def pool_from_process_group(**kwargs: Any) -> Any:
        # The adapter's tensors live on the meta device here; the pool needs a CUDA one.
        return pcie.PCIeDCPA2APool.from_process_group(**{**kwargs, "device": DEVICE})

    return bb.B12xApi(
        pool_from_process_group=pool_from_process_group,
        query_from_runtime=query,
        plan=plan,
        prepare=prepare,
        use_stream=cuda.stream,
    )


class MetaAllocator:
    """The adapter's allocator on the meta device (shapes, no memory), counting slabs."""

    device = torch.device("meta")

    def __init__(self) -> None:
        self.external: list[tuple[str, int]] = []

    def empty(self, shape: Any, dtype: torch.dtype, *, owner: Any, name: str) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, device="meta")

    def record_external(self, nbytes: int, *, owner: Any, name: str) -> None:
        self.external.append((name, nbytes))
