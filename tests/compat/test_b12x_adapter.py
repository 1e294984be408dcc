"""Our b12x transport adapter's calls bind to b12x 1.5.1's real API, so an API change fails here.

No GPU: `B12xDCPTransport` runs its whole lifecycle (create, gather, reduce in both LSE bases,
close) against recording fakes that first bind every call to the real b12x callable's signature
(`inspect.signature(real).bind(...)`): the pool's class and methods, `query_from_runtime`,
`plan`, `Plan.request`, `prepare_default` and the DCP `prepare_call`. The adapter's own `prepare`
closure from `load_b12x_api()` is the real one, fed patched `prepare_default`/`prepare_call`.

The call metadata (`call=` dicts) is not a signature: b12x reads it with `call["k"]` and
`call.get("k", default)`, so a misspelt key would silently fall back to a default (the LSE base!).
Its keys are checked against the keys b12x's DCP preparation module reads.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pcie = pytest.importorskip(
    "b12x.comm.pcie.pcie_dcp_a2a",
    reason="b12x is not installed (nox -s compat installs b12x==1.5.1)",
    exc_type=ModuleNotFoundError,
)

import b12x.comm.pcie._dcp_preparation as dcp_preparation  # noqa: E402
import b12x.preparation as preparation  # noqa: E402

from harness.core.signature import TransportSignature  # noqa: E402
from harness.transport import b12x_backend as bb  # noqa: E402
from harness.transport.dtypes import dtype_name  # noqa: E402

pytestmark = pytest.mark.compat

Pool = pcie.PCIeDCPA2APool
KIMI = TransportSignature("bf16", 96, 576, 512, 16, max_tokens=8, device_type="cuda")
DSV4 = TransportSignature("fp16", 64, 512, 512, 8, max_tokens=4, device_type="cuda")


class SignatureMismatch(AssertionError):
    """The adapter calls a b12x callable with arguments its real signature does not take."""


def bind(real: Callable[..., Any], *args: Any, **kwargs: Any) -> inspect.BoundArguments:
    """Bind as calling `real` would; fail naming the callable, its signature and the keywords."""
    signature = inspect.signature(real)
    try:
        return signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise SignatureMismatch(
            f"b12x {real.__qualname__}{signature} does not take the adapter's call "
            f"(keywords {sorted(kwargs)}): {exc}"
        ) from None


def call_keys_b12x_reads() -> frozenset[str]:
    """Keys b12x's DCP preparation reads from a `call` mapping: `call["k"]`, `call.get("k")`,
    `_call_value(call, "k")`."""
    keys: set[str] = set()
    for node in ast.walk(ast.parse(inspect.getsource(dcp_preparation))):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "call"
            and isinstance(node.slice, ast.Constant)
        ):
            keys.add(node.slice.value)
        elif isinstance(node, ast.Call) and node.args:
            func, args = node.func, node.args
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "get"
                and isinstance(func.value, ast.Name)
                and func.value.id == "call"
                and isinstance(args[0], ast.Constant)
            ):
                keys.add(args[0].value)
            if (
                isinstance(func, ast.Name)
                and func.id == "_call_value"
                and len(args) == 2
                and isinstance(args[1], ast.Constant)
            ):
                keys.add(args[1].value)
    return frozenset(k for k in keys if isinstance(k, str))


def unread_keys(call: dict[str, Any]) -> set[str]:
    return set(call) - call_keys_b12x_reads()


# -- recording fakes that bind first -------------------------------------------------------------


class CheckedPool:
    """A live `PCIeDCPA2APool` stand-in: each method call is bound to the real method first."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def __getattr__(self, name: str) -> Callable[..., Any]:
        real = getattr(Pool, name, None)
        if real is None:
            raise SignatureMismatch(f"b12x PCIeDCPA2APool has no {name!r}; the adapter uses it")

        def method(*args: Any, **kwargs: Any) -> Any:
            bind(real, self, *args, **kwargs)
            self.calls.append(f"PCIeDCPA2APool.{name}")
            channel = SimpleNamespace(world_size=KIMI.dcp_world_size)
            if name == "capture":
                return contextlib.nullcontext(channel)
            return channel if name == "for_stream" else None

        return method


class MetaAllocator:
    """The adapter's allocator, on the meta device: shapes without memory."""

    device = torch.device("meta")

    def empty(self, shape, dtype, *, owner, name) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, device=self.device)

    def record_external(self, nbytes, *, owner, name) -> None:
        pass


def checked_api(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> bb.B12xApi:
    """`load_b12x_api()` with every b12x entry point behind a binding check."""
    real_prepare_default = preparation.prepare_default
    real_prepare_call = dcp_preparation.prepare_call

    def prepare_call(state: Any, **call: Any) -> None:
        bind(real_prepare_call, state, **call)
        assert not unread_keys(call), f"call keys b12x never reads: {unread_keys(call)}"
        calls.append("prepare_call")

    def prepare_default(request: Any) -> None:
        bind(real_prepare_default, request)
        calls.append("prepare_default")
        request.prepare_call(SimpleNamespace(query=request.plan.query))

    monkeypatch.setattr(dcp_preparation, "prepare_call", prepare_call)
    monkeypatch.setattr(preparation, "prepare_default", prepare_default)
    real = bb.load_b12x_api()

    class CheckedPlan:
        def __init__(self, query: Any) -> None:
            self.query = query

        def request(self, **kwargs: Any) -> Any:
            bind(preparation.Plan.request, self, **kwargs)
            calls.append("Plan.request")
            return SimpleNamespace(plan=self, **kwargs)

    def pool_from_process_group(**kwargs: Any) -> CheckedPool:
        bind(real.pool_from_process_group, **kwargs)
        calls.append("PCIeDCPA2APool.from_process_group")
        return CheckedPool(calls)

    def query_from_runtime(runtime: Any, **kwargs: Any) -> Any:
        bind(real.query_from_runtime, runtime, **kwargs)
        assert not unread_keys(kwargs["call"]), unread_keys(kwargs["call"])
        calls.append("query_from_runtime")
        return SimpleNamespace(surface=kwargs["surface"])

    def plan(query: Any, **kwargs: Any) -> CheckedPlan:
        bind(real.plan, query, **kwargs)
        calls.append("plan")
        return CheckedPlan(query)

    def use_stream(stream: Any) -> contextlib.AbstractContextManager[None]:
        bind(torch.cuda.stream, stream)
        calls.append("torch.cuda.stream")
        return contextlib.nullcontext()

    return bb.B12xApi(
        pool_from_process_group=pool_from_process_group,
        query_from_runtime=query_from_runtime,
        plan=plan,
        prepare=real.prepare,
        use_stream=use_stream,
    )


# -- the adapter against the real API -----------------------------------------------------------

EVERY_ENTRY_POINT = {
    "PCIeDCPA2APool.from_process_group",
    "PCIeDCPA2APool.prepare_channels",
    "PCIeDCPA2APool.for_stream",
    "PCIeDCPA2APool.all_gather_heads",
    "PCIeDCPA2APool.lse_reduce_scatter",
    "PCIeDCPA2APool.capture",
    "PCIeDCPA2APool.close",
    "torch.cuda.stream",
    "query_from_runtime",
    "plan",
    "Plan.request",
    "prepare_default",
    "prepare_call",
}


def test_the_adapter_lifecycle_binds_to_the_real_b12x_api(monkeypatch):
    calls: list[str] = []
    transport = bb.B12xDCPTransport(
        KIMI, object(), allocator=MetaAllocator(), api=checked_api(monkeypatch, calls)
    )
    meta = {"device": "meta", "dtype": torch.bfloat16}
    transport.gather_queries(torch.empty(3, KIMI.local_heads, 576, **meta))
    partial = torch.empty(3, KIMI.total_heads, 512, **meta)
    lse = torch.empty(3, KIMI.total_heads, device="meta", dtype=torch.float32)
    for base_e in (True, False):
        transport.reduce_outputs(partial, lse, base_e=base_e)
    with transport.capture_scope(object()):  # a graph channel: its own three plans
        transport.gather_queries(torch.empty(3, KIMI.local_heads, 576, **meta))
    transport.close()
    assert set(calls) == EVERY_ENTRY_POINT
    assert calls.count("prepare_call") == 6  # gather + one reduction per LSE base, per channel


@pytest.mark.parametrize("base_e", [True, False])
def test_the_lse_base_reaches_b12x_under_its_own_name(base_e):
    x = torch.zeros(1)
    bound = bind(Pool.lse_reduce_scatter, None, **bb.reduce_kwargs(x, x, plan=None, base_e=base_e))
    assert bound.arguments["is_lse_base_on_e"] is base_e
    assert bb.reduce_call(x, x, base_e=base_e)["is_lse_base_on_e"] is base_e


def test_surfaces_are_b12x_dcp_surfaces():
    assert {bb.GATHER_SURFACE, bb.REDUCE_SURFACE} <= dcp_preparation._DCP_SURFACES


def test_mirrored_constants_equal_b12x():
    assert bb.SUPPORTED_WORLD_SIZES == pcie.SUPPORTED_WORLD_SIZES
    assert set(bb.SUPPORTED_DTYPES) == {dtype_name(d) for d in pcie.SUPPORTED_DTYPES}
    gather = {dtype_name(d) for d in pcie.SUPPORTED_GATHER_DTYPES}
    assert set(bb.SUPPORTED_GATHER_DTYPES) == gather  # fp8 e4m3 queries included
    assert bb._SIGNAL_BYTES == pcie._SIGNAL_BYTES
    assert bb._IPC_ALIGN == pcie.IPC_SLAB_ALIGNMENT


@pytest.mark.parametrize("sig", [KIMI, DSV4], ids=["kimi-k3", "deepseek-v4"])
def test_slab_bytes_equal_b12x_staging_layout(sig):
    layout = pcie._staging_layout(
        signal_bytes=pcie._SIGNAL_BYTES,
        world_size=sig.dcp_world_size,
        max_batch_size=sig.max_tokens,
        total_heads=sig.total_heads,
        head_dim=sig.output_head_dim,
        query_head_dim=sig.query_head_dim,
    )
    assert bb.slab_bytes(sig) == layout.slab_bytes


def test_the_call_key_reader_finds_what_b12x_reads():
    assert {
        "local_input",
        "partial_output",
        "partial_lse",
        "out",
        "is_lse_base_on_e",
        "threads",
        "block_limit",
    } <= call_keys_b12x_reads()


# -- the binding checks can fail -----------------------------------------------------------------


def test_a_renamed_b12x_keyword_fails_naming_it():
    """b12x renaming `is_lse_base_on_e` (simulated on a copy of the real signature)."""

    def lse_reduce_scatter(  # the real method with one keyword renamed
        self, partial_output, partial_lse, out=None, *, plan, lse_base_on_e=True,
        threads=256, block_limit=16, stream=None, channel_id=None,
    ):  # fmt: skip
        raise NotImplementedError

    x = torch.zeros(1)
    with pytest.raises(SignatureMismatch, match="unexpected keyword argument 'is_lse_base_on_e'"):
        bind(lse_reduce_scatter, None, **bb.reduce_kwargs(x, x, plan=None))


def test_a_new_required_b12x_argument_fails():
    def from_process_group(*, process_group, device, max_batch_size, total_heads, head_dim,
                           query_head_dim=None, num_channels):  # fmt: skip
        raise NotImplementedError

    kwargs = bb.pool_kwargs(KIMI, process_group=None, device="cuda")
    with pytest.raises(SignatureMismatch, match="missing a required argument: 'num_channels'"):
        bind(from_process_group, **kwargs)


def test_a_misspelt_call_key_is_caught():
    x = torch.zeros(1)
    call = bb.reduce_call(x, x, base_e=False)
    call["is_lse_base_on_E"] = call.pop("is_lse_base_on_e")
    assert unread_keys(call) == {"is_lse_base_on_E"}
