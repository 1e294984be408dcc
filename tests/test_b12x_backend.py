"""The b12x adapter without a GPU: argument mapping, geometry checks, availability reasons, and
the lifecycle against a fake b12x. Binding against the real b12x signatures, and the combine
against b12x's reference, live in tests/compat/ (`nox -s compat`)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from harness.core.signature import TransportSignature
from harness.errors import GeometryError
from harness.transport import b12x_backend as bb
from harness.transport.errors import BackendUnavailableError, CapacityError, RegistryClosedError

KIMI = TransportSignature("bf16", 96, 576, 512, 16, max_tokens=8, device_type="cuda")
DSV4 = TransportSignature("fp16", 64, 512, 512, 8, max_tokens=4, device_type="cuda")
SMALL = TransportSignature("bf16", 8, 24, 16, 2, max_tokens=4, device_type="cuda")


def test_availability_reason_is_given_here() -> None:
    usable, reason = bb.b12x_available()
    if torch.cuda.is_available():
        pytest.skip("this check is for machines without CUDA")
    assert not usable
    assert ("not importable" in reason) or ("CUDA is not available" in reason), reason


def test_creating_without_b12x_or_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this check is for machines without CUDA")
    with pytest.raises(BackendUnavailableError, match=r"cannot create b12x transport \[96 heads"):
        bb.B12xDCPTransport(KIMI, None, allocator=FakeAllocator())


KIMI_FP8 = TransportSignature(
    "bf16", 96, 576, 512, 16, max_tokens=8, device_type="cuda", query_dtype="fp8_e4m3fn"
)
DS_MLA = TransportSignature(  # 656-byte fp8_ds_mla records
    "bf16", 99, 656, 512, 9, max_tokens=8, device_type="cuda", query_dtype="fp8_e4m3fn"
)


@pytest.mark.parametrize(
    "sig", [KIMI, DSV4, SMALL, KIMI_FP8, DS_MLA], ids=["kimi-k3", "dsv4", "small", "fp8", "656"]
)
def test_supported_geometry(sig: TransportSignature) -> None:
    bb.check_pool_geometry(sig)


def test_fp8_query_records_must_be_16_byte_aligned() -> None:
    fields = {**KIMI_FP8.to_json(), "query_head_dim": 584}  # 8-aligned, not 16
    fields.pop("local_heads")
    with pytest.raises(GeometryError, match=r"16-byte records .* got 584 bytes"):
        bb.check_pool_geometry(TransportSignature(**fields))
    bf16 = {**fields, "query_dtype": "bf16"}  # 1168 bytes a record: b12x's own % 8 rule only
    bb.check_pool_geometry(TransportSignature(**bf16))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dtype": "fp32"}, "supports \\('bf16', 'fp16'\\)"),
        ({"dcp_world_size": 3, "total_heads": 96}, "world sizes"),
        ({"dcp_world_size": 6, "total_heads": 96}, "world sizes"),
        ({"query_head_dim": 580}, "query_head_dim % 8"),
        ({"output_head_dim": 500 + 1}, "output_head_dim % 8"),
        ({"device_type": "cpu"}, "runs on CUDA"),
    ],
)
def test_unsupported_geometry(changes: dict[str, Any], message: str) -> None:
    fields = {**KIMI.to_json(), **changes}
    fields.pop("local_heads")
    with pytest.raises(GeometryError, match=message):
        bb.check_pool_geometry(TransportSignature(**fields))


def test_pool_kwargs_map_the_signature() -> None:
    group, device = object(), torch.device("cuda", 3)
    assert bb.pool_kwargs(KIMI, process_group=group, device=device) == {
        "process_group": group,
        "device": device,
        "max_batch_size": 8,
        "total_heads": 96,
        "head_dim": 512,
        "query_head_dim": 576,
    }
    dsv4 = bb.pool_kwargs(DSV4, process_group=group, device=device)
    assert (dsv4["head_dim"], dsv4["query_head_dim"], dsv4["total_heads"]) == (512, 512, 64)


def test_call_kwargs() -> None:
    q, o, lse, plan = torch.zeros(1), torch.zeros(2), torch.zeros(3), object()
    assert bb.gather_kwargs(q, plan=plan) == {
        "local_input": q,
        "out": None,
        "threads": bb.THREADS,
        "block_limit": bb.BLOCK_LIMIT,
        "plan": plan,
        "channel_id": bb.EAGER_CHANNEL_ID,
    }
    kw = bb.reduce_kwargs(o, lse, plan=plan, base_e=False)
    assert kw["partial_output"] is o and kw["partial_lse"] is lse and kw["plan"] is plan
    assert kw["is_lse_base_on_e"] is False and kw["channel_id"] == bb.EAGER_CHANNEL_ID
    assert bb.query_kwargs(bb.REDUCE_SURFACE, {"a": 1}) == {
        "surface": "DcpAllToAllPool.lse_reduce_scatter",
        "call": {"a": 1},
    }


def test_slab_bytes_match_b12x_1_5_1_layout() -> None:
    # Value of b12x 1.5.1 `_staging_layout(...).slab_bytes` for this geometry.
    assert bb.slab_bytes(KIMI) == 2041856


# -- lifecycle against a fake b12x ----------------------------------------------------------


class FakeAllocator:
    """Allocates on the meta device (no memory), counting like the registry's allocator."""

    device = torch.device("meta")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.external: list[tuple[str, int]] = []

    def empty(self, shape, dtype, *, owner, name):
        self.names.append(name)
        return torch.empty(tuple(shape), dtype=dtype, device=self.device)

    def record_external(self, nbytes, *, owner, name):
        self.external.append((name, nbytes))


class FakePool:
    def __init__(self, log: list[tuple[str, Any]], **kwargs: Any) -> None:
        self.log = log
        self.kwargs = kwargs
        self.closes = 0
        log.append(("pool", kwargs))

    def prepare_channels(self, ids):
        self.log.append(("prepare_channels", tuple(ids)))

    def for_stream(self, stream=None, *, channel_id=None):
        self.log.append(("for_stream", channel_id))
        return "channel"

    def all_gather_heads(self, local_input, out=None, **kw):
        self.log.append(("all_gather_heads", {"local_input": local_input, "out": out, **kw}))
        return "gathered"

    def lse_reduce_scatter(self, partial_output, partial_lse, out=None, **kw):
        self.log.append(("lse_reduce_scatter", {"partial_output": partial_output, **kw}))
        return "reduced"

    def close(self):
        self.closes += 1
        self.log.append(("close", None))


def fake_api(log: list[tuple[str, Any]], *, fail_prepare: bool = False) -> bb.B12xApi:
    pools: list[FakePool] = []

    def from_pg(**kwargs):
        pools.append(FakePool(log, **kwargs))
        return pools[-1]

    def query(runtime, *, surface, call):
        log.append(("query", (runtime, surface, call.get("is_lse_base_on_e"))))
        return ("query", surface, call.get("is_lse_base_on_e"))

    def plan(q, *, runtime):
        log.append(("plan", q))
        return ("plan", *q[1:])

    def prepare(p, call):
        if fail_prepare:
            raise RuntimeError("compile failed")
        log.append(("prepare", p))

    return bb.B12xApi(
        pool_from_process_group=from_pg, query_from_runtime=query, plan=plan, prepare=prepare
    )


def test_lifecycle_with_a_fake_b12x() -> None:
    log: list[tuple[str, Any]] = []
    alloc = FakeAllocator()
    group = object()
    t = bb.B12xDCPTransport(SMALL, group, allocator=alloc, api=fake_api(log))
    kinds = [k for k, _ in log]
    assert kinds[:3] == ["pool", "prepare_channels", "for_stream"], kinds
    assert log[0][1] == bb.pool_kwargs(SMALL, process_group=group, device=alloc.device)
    assert log[1][1] == (bb.EAGER_CHANNEL_ID, bb.graph_channel_id(0))
    assert log[2][1] == bb.EAGER_CHANNEL_ID
    prepared = [v for k, v in log if k == "prepare"]
    assert prepared == [
        ("plan", bb.GATHER_SURFACE, None),
        ("plan", bb.REDUCE_SURFACE, True),
        ("plan", bb.REDUCE_SURFACE, False),
    ]
    slab = bb.slab_bytes(SMALL)
    assert alloc.external == [("b12x_ipc_slab_eager", slab), ("b12x_ipc_slab_graph", slab)]
    assert len(alloc.names) == 5  # max_tokens-shaped plan tensors, all at creation

    log.clear()
    q = torch.empty(3, 4, 24, dtype=torch.bfloat16, device="meta")
    assert t.gather_queries(q) == "gathered"
    (kind, kw), *_ = log
    assert kind == "all_gather_heads" and kw["plan"] == t.eager.gather
    assert kw["channel_id"] == bb.EAGER_CHANNEL_ID and kw["local_input"].shape == (3, 4, 24)

    part = torch.empty(2, 8, 16, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(2, 8, dtype=torch.float32, device="meta")
    assert t.reduce_outputs(part, lse, base_e=False) == "reduced"
    kind, kw = log[-1]
    assert kind == "lse_reduce_scatter" and kw["plan"] == ("plan", bb.REDUCE_SURFACE, False)
    assert kw["is_lse_base_on_e"] is False

    with pytest.raises(CapacityError, match="exceeds max_tokens=4"):
        big = torch.empty(5, 8, 16, dtype=torch.bfloat16, device="meta")
        t.reduce_outputs(big, torch.empty(5, 8, device="meta"))
    assert log[-1][0] == "lse_reduce_scatter" and len(log) == 2  # b12x never saw the bad call
    assert [k for k, _ in log if k in ("plan", "prepare")] == []  # nothing planned after creation

    t.close()
    t.close()
    assert t.pool.closes == 1
    with pytest.raises(RegistryClosedError):
        t.gather_queries(q)


def test_failed_creation_closes_the_pool() -> None:
    log: list[tuple[str, Any]] = []
    with pytest.raises(RuntimeError, match="compile failed"):
        api = fake_api(log, fail_prepare=True)
        bb.B12xDCPTransport(SMALL, object(), allocator=FakeAllocator(), api=api)
    assert log[-1] == ("close", None)


# -- which transport the stand-in suites use -------------------------------------------------

SM120 = bb.DeviceFacts("", True, "cuda", (12, 0), "RTX PRO 6000", 8, "2.13.0")


@pytest.mark.parametrize(
    ("facts", "dcp", "backend", "why"),
    [
        (SM120, 16, "b12x", r"on RTX PRO 6000 \(sm_120\)"),
        (SM120, 9, "b12x", "sm_120"),
        (bb.DeviceFacts("", True, "cuda", (12, 1), "GB10", 2), 2, "b12x", "sm_121"),
        (bb.DeviceFacts("", True, "cuda", (9, 0), "H200", 8), 16, "torch", "H200 is sm_90"),
        (bb.DeviceFacts("", True, "cuda", (10, 0), "B200", 8), 16, "torch", "sm_100"),
        (bb.DeviceFacts("ModuleNotFoundError: b12x", True, "cuda", (12, 0)), 2, "torch", "b12x"),
        (bb.DeviceFacts("", True, "cuda", (12, 0), "RTX", 1), 2, "torch", "at least 2 visible"),
        (bb.DeviceFacts("", False, "cpu"), 2, "torch", "CUDA is not available"),
        (SM120, 6, "torch", "dcp=6"),
        (SM120, 1, "torch", "dcp=1"),
    ],
)
def test_the_stand_in_transport_follows_the_device(facts, dcp, backend, why) -> None:
    chosen, reason = bb.select_transport_backend(facts, dcp)
    assert chosen == backend
    assert re.search(why, reason), reason
    from harness.transport.registry import stand_in_backend

    assert stand_in_backend("cuda", dcp, facts) == (chosen, reason)


def test_this_machine_without_an_sm12x_gpu_gets_the_torch_transport() -> None:
    if torch.cuda.is_available():
        pytest.skip("this check is for machines without CUDA")
    from harness.transport.registry import stand_in_registry

    assert bb.select_transport_backend(bb.device_facts("cpu"), 2)[0] == "torch"
    with stand_in_registry("cpu", 2) as registry:
        assert registry.backend == "torch"
