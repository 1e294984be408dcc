"""Adapter over b12x's PCIe DCP transport (`PCIeDCPA2APool`): CUDA sm_12x with b12x only.

What b12x 1.5.1 expects (read from `b12x/comm/pcie/pcie_dcp_a2a.py`, `_dcp_preparation.py`):
- `PCIeDCPA2APool.from_process_group(process_group=, device=, max_batch_size=, total_heads=,
  head_dim=, query_head_dim=)` is collective (IPC slab, handle exchange).
- Eager use of a distributed pool needs a named logical channel, prepared collectively:
  `pool.prepare_channels((id,))`, then calls with `channel_id=id`.
- Channels are stream-affine: the first stream a channel runs on owns it, and binding it to a
  second stream raises ("use a separate channel for each CUDA stream"). A CUDA graph therefore
  gets its own channel, entered with `pool.capture(stream, channel_id=graph_id)` *before* the
  capture begins (entered during capture it raises; `for_stream` during capture without it
  raises). Inside that context every call on the pool, the eager warm-up iterations on the
  capture's side stream included, runs on the graph channel; after it the eager mapping is back.
  Each independently replayable graph needs its own id (b12x refuses to capture an id twice).
- A prepared plan belongs to one channel (`require_runtime` checks the owner's identity), so the
  eager channel and each graph channel have their own plans, all prepared before capture.
- Every call takes a prepared `Plan`: `query_from_runtime(channel, surface=, call=)` ->
  `b12x.comm.pcie.plan(query, runtime=channel)` -> prepared by `prepare_default(plan.request(
  name=, prepare_call=))` (compiles the launchers, then primes them with a real, collective call).
  The compiled launchers depend on (world size, rank, dtype, threads), not on the batch, and a
  prepared state checks only the channel identity, so one plan per surface (and per LSE base for
  the reduction), declared at creation with max_tokens-shaped tensors, serves every batch up to
  max_tokens: nothing is planned or compiled after creation.

The argument mapping lives in pure functions (`pool_kwargs`, `gather_call`, `reduce_call`,
`gather_kwargs`, `reduce_kwargs`, `check_pool_geometry`), so unit tests check it without a GPU,
and a binding check can `inspect.signature(...).bind(**kwargs)` them against real b12x. The
library calls go through a `B12xApi` value; tests pass fakes to check the lifecycle.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from harness.core.signature import FP8_E4M3, TransportSignature
from harness.errors import GeometryError, UsageError
from harness.transport.allocator import Allocator
from harness.transport.checks import OperationGuard, UseHook
from harness.transport.dtypes import output_torch_dtype, query_torch_dtype
from harness.transport.errors import BackendUnavailableError

# Mirrors b12x 1.5.1 `pcie_dcp_a2a.SUPPORTED_WORLD_SIZES` / `SUPPORTED_DTYPES` /
# `SUPPORTED_GATHER_DTYPES` (a compat test compares them with the installed b12x).
SUPPORTED_WORLD_SIZES: tuple[int, ...] = (2, 4, 8, 9, 10, 12, 16)
SUPPORTED_DTYPES: tuple[str, ...] = ("bf16", "fp16")
SUPPORTED_GATHER_DTYPES: tuple[str, ...] = (*SUPPORTED_DTYPES, FP8_E4M3)
# The fork gathers fp8 query records (576 B e4m3, 656 B fp8_ds_mla) on 16-byte boundaries.
FP8_RECORD_ALIGNMENT = 16
EAGER_CHANNEL_ID = "dcpqual:eager:dcp"
GRAPH_CHANNEL_PREFIX = "dcpqual:graph:dcp"
GATHER_SURFACE = "DcpAllToAllPool.all_gather_heads"
REDUCE_SURFACE = "DcpAllToAllPool.lse_reduce_scatter"
THREADS = 256
BLOCK_LIMIT = 16
# b12x 1.5.1 slab layout constants (pcie_dcp_a2a._SIGNAL_BYTES, pcie_oneshot.IPC_SLAB_ALIGNMENT)
_SIGNAL_BYTES = (64 * 16 + 2 * 64 * 16 * 32) * 4
_IPC_ALIGN = 256


@dataclass(frozen=True)
class DeviceFacts:
    """What decides whether b12x can run here, read once (`device_facts`) so the decision
    (`b12x_usable`, `select_transport_backend`) is a pure function tests feed fakes."""

    b12x_error: str  # "" when b12x imports
    cuda_available: bool
    device_type: str = "cuda"
    capability: tuple[int, int] = (0, 0)
    name: str = ""
    device_count: int = 0
    torch_version: str = ""


def device_facts(device: torch.device | str | None = None) -> DeviceFacts:
    """The facts of this machine and `device` (default: the current CUDA device)."""
    try:
        import b12x.comm.pcie.pcie_dcp_a2a  # noqa: F401

        error = ""
    except Exception as exc:  # ImportError, or a broken install failing at import
        error = f"{type(exc).__name__}: {exc}"
    dev = torch.device(device) if device is not None else torch.device("cuda")
    if not torch.cuda.is_available() or dev.type != "cuda":
        return DeviceFacts(
            error, torch.cuda.is_available(), dev.type, torch_version=torch.__version__
        )
    return DeviceFacts(
        error,
        True,
        dev.type,
        tuple(torch.cuda.get_device_capability(dev)),  # type: ignore[arg-type]
        torch.cuda.get_device_name(dev),
        torch.cuda.device_count(),
        torch.__version__,
    )


def b12x_usable(facts: DeviceFacts) -> tuple[bool, str]:
    """(usable, reason): whether the b12x backend can run on these facts, and why not."""
    if facts.b12x_error:
        return False, f"b12x is not importable ({facts.b12x_error})"
    if not facts.cuda_available:
        return False, f"CUDA is not available (torch {facts.torch_version}); b12x needs sm_12x GPUs"
    if facts.device_type != "cuda":
        return False, f"b12x runs on CUDA devices, got {facts.device_type}"
    major, minor = facts.capability
    if major != 12:
        return False, f"{facts.name} is sm_{major}{minor}; b12x PCIe DCP kernels need sm_12x"
    if facts.device_count < 2:
        return False, "b12x PCIe collectives need at least 2 visible CUDA devices"
    return True, f"b12x {_b12x_version()} on {facts.name} (sm_{major}{minor})"


def b12x_available(device: torch.device | str | None = None) -> tuple[bool, str]:
    """(usable, reason) for this machine: `b12x_usable(device_facts(device))`."""
    return b12x_usable(device_facts(device))


def select_transport_backend(facts: DeviceFacts, dcp: int) -> tuple[str, str]:
    """The transport backend a stand-in run uses, and why: b12x where it can run (an sm_12x
    GPU, b12x importable, a DCP size b12x supports), else torch's collectives."""
    usable, reason = b12x_usable(facts)
    if usable and dcp not in SUPPORTED_WORLD_SIZES:
        usable, reason = False, f"b12x DCP supports {SUPPORTED_WORLD_SIZES}, the run has dcp={dcp}"
    return ("b12x", reason) if usable else ("torch", reason)


def _b12x_version() -> str:
    try:
        return importlib.metadata.version("b12x")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# -- pure argument mapping ------------------------------------------------------------------


def check_pool_geometry(signature: TransportSignature) -> None:
    """Reject signatures b12x's pool cannot take, before any collective or CUDA work."""
    sig = signature
    if sig.dcp_world_size not in SUPPORTED_WORLD_SIZES:
        raise GeometryError(
            f"b12x DCP supports world sizes {SUPPORTED_WORLD_SIZES}, got dcp={sig.dcp_world_size}"
        )
    if sig.dtype not in SUPPORTED_DTYPES:
        raise GeometryError(f"b12x DCP reduction supports {SUPPORTED_DTYPES}, got {sig.dtype}")
    if sig.query_dtype not in SUPPORTED_GATHER_DTYPES:
        raise GeometryError(
            f"b12x DCP query gather supports {SUPPORTED_GATHER_DTYPES}, got {sig.query_dtype}"
        )
    for name in ("query_head_dim", "output_head_dim"):
        if getattr(sig, name) % 8:
            raise GeometryError(f"b12x DCP needs {name} % 8 == 0, got {getattr(sig, name)}")
    if sig.query_dtype == FP8_E4M3 and sig.query_head_dim % FP8_RECORD_ALIGNMENT:
        raise GeometryError(
            f"the fork's fp8 query gather needs {FP8_RECORD_ALIGNMENT}-byte records (576, or "
            f"656 for fp8_ds_mla), got {sig.query_head_dim} bytes"
        )
    if sig.device_type != "cuda":
        raise GeometryError(f"b12x DCP runs on CUDA, signature is for {sig.device_type}")


def pool_kwargs(
    signature: TransportSignature, *, process_group: Any, device: torch.device | str | int
) -> dict[str, Any]:
    """Keyword arguments of `PCIeDCPA2APool.from_process_group` for a signature."""
    return {
        "process_group": process_group,
        "device": device,
        "max_batch_size": signature.max_tokens,
        "total_heads": signature.total_heads,
        "head_dim": signature.output_head_dim,
        "query_head_dim": signature.query_head_dim,
    }


def gather_call(local_input: torch.Tensor, out: torch.Tensor | None = None) -> dict[str, Any]:
    """The `call` metadata of the gather surface (`query_from_runtime` and plan priming)."""
    return {"local_input": local_input, "out": out, "threads": THREADS, "block_limit": BLOCK_LIMIT}


def reduce_call(
    partial_output: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    base_e: bool = True,
) -> dict[str, Any]:
    """The `call` metadata of the reduction surface."""
    return {
        "partial_output": partial_output,
        "partial_lse": partial_lse,
        "out": out,
        "is_lse_base_on_e": base_e,
        "threads": THREADS,
        "block_limit": BLOCK_LIMIT,
    }


def graph_channel_id(index: int) -> str:
    """The logical channel of a transport's `index`-th captured graph (same on every rank, as
    every rank captures the same graphs in the same order)."""
    return f"{GRAPH_CHANNEL_PREFIX}:{index}"


def gather_kwargs(
    local_input: torch.Tensor,
    *,
    plan: Any,
    out: torch.Tensor | None = None,
    channel_id: str = EAGER_CHANNEL_ID,
) -> dict[str, Any]:
    """Keyword arguments of `PCIeDCPA2APool.all_gather_heads`."""
    return {**gather_call(local_input, out), "plan": plan, "channel_id": channel_id}


def reduce_kwargs(
    partial_output: torch.Tensor,
    partial_lse: torch.Tensor,
    *,
    plan: Any,
    out: torch.Tensor | None = None,
    base_e: bool = True,
    channel_id: str = EAGER_CHANNEL_ID,
) -> dict[str, Any]:
    """Keyword arguments of `PCIeDCPA2APool.lse_reduce_scatter`."""
    call = reduce_call(partial_output, partial_lse, out, base_e=base_e)
    return {**call, "plan": plan, "channel_id": channel_id}


def query_kwargs(surface: str, call: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of `b12x.comm.pcie.query_from_runtime(channel, **kwargs)`."""
    return {"surface": surface, "call": dict(call)}


def slab_bytes(signature: TransportSignature) -> int:
    """The IPC slab one b12x 1.5.1 DCP channel allocates (its `_staging_layout`), for counting."""

    def up(n: int) -> int:
        return (n + _IPC_ALIGN - 1) // _IPC_ALIGN * _IPC_ALIGN

    sig = signature
    width = max(sig.output_head_dim, sig.query_head_dim)
    output_bytes = up(sig.max_tokens * sig.total_heads * width * 2)
    lse_bytes = up(sig.max_tokens * sig.total_heads * 4)
    slot = up(output_bytes + lse_bytes)
    return up(_SIGNAL_BYTES) + 2 * slot


# -- the library seam -----------------------------------------------------------------------


@dataclass(frozen=True)
class B12xApi:
    """The b12x entry points the adapter uses; `load_b12x_api()` binds the real ones."""

    pool_from_process_group: Callable[..., Any]
    query_from_runtime: Callable[..., Any]
    plan: Callable[..., Any]
    prepare: Callable[[Any, Mapping[str, Any]], None]
    # Makes a stream current (a graph channel's plans are primed on the capture's stream).
    use_stream: Callable[[Any], AbstractContextManager[Any]] = torch.cuda.stream


def load_b12x_api() -> B12xApi:
    """Import b12x's DCP pool, planning and preparation; raise a clear error where absent."""
    try:
        from b12x.comm.pcie._dcp_preparation import prepare_call
        from b12x.comm.pcie.api import plan, query_from_runtime
        from b12x.comm.pcie.pcie_dcp_a2a import PCIeDCPA2APool
        from b12x.preparation import prepare_default
    except Exception as exc:
        raise BackendUnavailableError(f"b12x backend unavailable: {exc}") from exc

    def prepare(plan_: Any, call: Mapping[str, Any]) -> None:
        request = plan_.request(
            name=f"dcpqual:{plan_.query.surface}",
            prepare_call=lambda state: prepare_call(state, **call),
        )
        prepare_default(request)

    return B12xApi(
        pool_from_process_group=PCIeDCPA2APool.from_process_group,
        query_from_runtime=query_from_runtime,
        plan=plan,
        prepare=prepare,
    )


@dataclass(frozen=True)
class ChannelPlans:
    """One b12x channel and the plans prepared for it (a plan serves only its own channel)."""

    channel_id: str
    channel: Any
    gather: Any
    reduce: Mapping[bool, Any]  # by LSE base (part of b12x's query metadata)


class B12xDCPTransport(OperationGuard):
    """One b12x DCP pool for a signature: an eager channel with its plans prepared at creation
    (collective), and a graph channel per capture, entered with `capture_scope` before the
    capture begins (see the module doc)."""

    backend = "b12x"
    strategy = "fused"
    label = "b12x transport"

    def __init__(
        self,
        signature: TransportSignature,
        group: dist.ProcessGroup | None,
        *,
        allocator: Allocator,
        api: B12xApi | None = None,
        on_use: UseHook | None = None,
    ) -> None:
        check_pool_geometry(signature)
        if api is None:
            usable, reason = b12x_available(allocator.device)
            if not usable:
                raise BackendUnavailableError(
                    f"cannot create b12x transport [{signature.describe()}]: {reason}"
                )
            api = load_b12x_api()
        self.signature = signature
        self.group = group if group is not None else dist.group.WORLD
        self.device = allocator.device
        super().__init__(on_use)
        self._api = api
        self._allocator = allocator
        self._graph: ChannelPlans | None = None
        self.captures = 0
        self.pool = api.pool_from_process_group(
            **pool_kwargs(signature, process_group=self.group, device=self.device)
        )
        try:
            # The eager channel and the first graph's channel: one slab each, both at creation.
            for name in ("b12x_ipc_slab_eager", "b12x_ipc_slab_graph"):
                allocator.record_external(slab_bytes(signature), owner=signature, name=name)
            self.pool.prepare_channels((EAGER_CHANNEL_ID, graph_channel_id(0)))
            self._calls = self._plan_calls(allocator)
            eager = self.pool.for_stream(None, channel_id=EAGER_CHANNEL_ID)
            self.eager = self._prepare(EAGER_CHANNEL_ID, eager)
        except BaseException:
            self.pool.close()
            self.closed = True
            raise

    def _plan_calls(self, allocator: Allocator) -> dict[str, Any]:
        """max_tokens-shaped call metadata for every plan, allocated once at creation."""
        sig, t = self.signature, self.signature.max_tokens

        def buf(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return allocator.empty(shape, dtype, owner=sig, name=name).zero_()

        qdt, odt = query_torch_dtype(sig), output_torch_dtype(sig)
        q = buf("plan_query", (t, sig.local_heads, sig.query_head_dim), qdt)
        gathered = buf("plan_gathered", (t, sig.total_heads, sig.query_head_dim), qdt)
        part = buf("plan_partial", (t, sig.total_heads, sig.output_head_dim), odt)
        lse = buf("plan_lse", (t, sig.total_heads), torch.float32)
        reduced = buf("plan_reduced", (t, sig.local_heads, sig.output_head_dim), odt)
        calls: dict[str, Any] = {"gather": gather_call(q, gathered)}
        for base_e in (True, False):
            calls[f"reduce:{base_e}"] = reduce_call(part, lse, reduced, base_e=base_e)
        return calls

    def _prepare(self, channel_id: str, channel: Any) -> ChannelPlans:
        gather = self._plan(channel, GATHER_SURFACE, self._calls["gather"])
        reduce = {
            base_e: self._plan(channel, REDUCE_SURFACE, self._calls[f"reduce:{base_e}"])
            for base_e in (True, False)
        }
        return ChannelPlans(channel_id, channel, gather, reduce)

    def _plan(self, channel: Any, surface: str, call: Mapping[str, Any]) -> Any:
        query = self._api.query_from_runtime(channel, **query_kwargs(surface, call))
        plan = self._api.plan(query, runtime=channel)
        self._api.prepare(plan, call)
        return plan

    @contextmanager
    def capture_scope(self, stream: Any) -> Iterator[ChannelPlans]:
        """Enter this transport's next graph channel on `stream` (the capture's stream) and
        prepare its plans; every call inside runs on it. Enter before warm-up and capture
        begin, and leave after the capture ends. Collective (b12x validates the id on every
        rank), so every rank enters the same scopes in the same order."""
        self._live()
        if self._graph is not None:
            raise UsageError("a b12x transport's capture scope is already open")
        channel_id = graph_channel_id(self.captures)
        if self.captures:  # b12x prepares a later graph's channel (a slab) when it is entered
            self._allocator.record_external(
                slab_bytes(self.signature), owner=self.signature, name="b12x_ipc_slab_graph"
            )
        self.captures += 1
        with self.pool.capture(stream, channel_id=channel_id) as channel:
            with self._api.use_stream(stream):  # priming runs on the channel's own stream
                self._graph = self._prepare(channel_id, channel)
            try:
                yield self._graph
            finally:
                self._graph = None

    @property
    def active(self) -> ChannelPlans:
        """The channel calls run on now: the open graph channel, else the eager one."""
        return self._graph if self._graph is not None else self.eager

    def gather_queries(
        self, q_local: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[B, h, qdim] -> [B, h*dcp, qdim] through b12x's `all_gather_heads` (rank-major)."""
        self._begin_gather(q_local, out)
        plans = self.active
        gathered: torch.Tensor = self.pool.all_gather_heads(
            **gather_kwargs(
                q_local.contiguous(), plan=plans.gather, out=out, channel_id=plans.channel_id
            )
        )
        return gathered

    def reduce_outputs(
        self,
        partial_out: torch.Tensor,
        partial_lse: torch.Tensor,
        out: torch.Tensor | None = None,
        *,
        base_e: bool = True,
    ) -> torch.Tensor:
        """[B, H, odim] + fp32 [B, H] -> [B, H/dcp, odim] through `lse_reduce_scatter`."""
        self._begin_reduce(partial_out, partial_lse, out)
        plans = self.active
        reduced: torch.Tensor = self.pool.lse_reduce_scatter(
            **reduce_kwargs(
                partial_out,
                partial_lse.contiguous(),
                plan=plans.reduce[bool(base_e)],
                out=out,
                base_e=base_e,
                channel_id=plans.channel_id,
            )
        )
        return reduced

    def close(self) -> None:
        """Close the pool (collective in b12x: every rank must close together); idempotent."""
        if not self.closed:
            self.closed = True
            self.pool.close()
