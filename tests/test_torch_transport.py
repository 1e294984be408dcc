"""The torch transport's gather and both reductions, every rank in the test process (threads;
`tests/_support/threaded_dist.py`), against the independent float64 reference: DCP 2 and 4,
AG+RS (native and all-to-all reduce-scatter) and A2A, bf16 and fp32, base e and 2, every
adversarial LSE pattern; and the first-use report before each operation's collectives."""

from __future__ import annotations

import pytest
import torch
from _support.threaded_dist import Member, patch_torch_backend, run_ranks

from harness.core.signature import TransportSignature
from harness.transport import combine, torch_backend
from harness.transport.allocator import CountingAllocator
from harness.transport.dtypes import output_torch_dtype
from harness.transport.errors import TransportUsageError
from harness.transport.testing import (
    PATTERNS,
    assert_matches,
    bit_equal,
    expected_gather,
    make_partials,
    make_queries,
)
from harness.transport.torch_backend import TorchDCPTransport

IMPLS = {
    "ag_rs": ("ag_rs", "native"),
    "ag_rs_a2a": ("ag_rs", "all_to_all"),
    "a2a": ("a2a", "native"),
}


@pytest.fixture(autouse=True)
def threaded(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_torch_backend(monkeypatch, torch_backend)


def _transport(sig: TransportSignature, member: Member, impl: str, uses=None) -> TorchDCPTransport:
    strategy, rs = IMPLS[impl]
    return TorchDCPTransport(
        sig, member, allocator=CountingAllocator("cpu"), strategy=strategy, reduce_scatter=rs,
        on_use=uses,
    )  # fmt: skip


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_every_pattern_matches_the_reference_on_every_rank(impl, world, dtype) -> None:
    sig = TransportSignature(dtype, 3 * world, 8, 6, world, max_tokens=3)

    def body(member: Member) -> list[str]:
        transport = _transport(sig, member, impl)
        failures = []
        for pattern in PATTERNS:
            parts = make_partials(
                world, 3, sig.total_heads, 6, output_torch_dtype(sig), pattern=pattern, seed=5
            )
            for base_e in (True, False):
                got = transport.reduce_outputs(*parts.of_rank(member.rank), base_e=base_e)
                try:
                    assert_matches(got, parts.expected(member.rank, base_e=base_e), what=pattern)
                except AssertionError as exc:
                    failures.append(f"{pattern} base_e={base_e}: {exc}")
        return failures

    for rank, failures in enumerate(run_ranks(world, body)):
        assert not failures, f"rank {rank}: {failures[:2]}"


@pytest.mark.parametrize("impl", list(IMPLS))
def test_one_hot_routing_is_exact_and_out_is_filled(impl) -> None:
    world = 4
    sig = TransportSignature("bf16", 8, 8, 5, world, max_tokens=2)
    parts = make_partials(world, 2, 8, 5, torch.bfloat16, pattern="one_hot", seed=3)

    def body(member: Member) -> None:
        transport = _transport(sig, member, impl)
        out = torch.full((2, 2, 5), 9.0, dtype=torch.bfloat16)
        got = transport.reduce_outputs(*parts.of_rank(member.rank), out=out)
        assert got is out
        block, lses = parts.head_block(member.rank)
        live = torch.isfinite(lses).int().argmax(dim=0)
        picked = torch.gather(block, 0, live[None, :, :, None].expand(1, -1, -1, 5))[0]
        assert bit_equal(got, picked)

    run_ranks(world, body)


@pytest.mark.parametrize("impl", ["ag_rs", "a2a"])
def test_gather_is_bit_exact_rank_major(impl) -> None:
    world = 4
    sig = TransportSignature("bf16", 8, 7, 5, world, max_tokens=3)
    queries = make_queries(world, 3, 2, 7, torch.bfloat16, seed=2)

    def body(member: Member) -> None:
        transport = _transport(sig, member, impl)
        for batch in (1, 3):
            got = transport.gather_queries(queries[member.rank, :batch].contiguous())
            assert bit_equal(got, expected_gather(queries[:, :batch]))
        out = torch.empty(2, 8, 7, dtype=torch.bfloat16)
        assert transport.gather_queries(queries[member.rank, :2].contiguous(), out=out) is out
        assert bit_equal(out, expected_gather(queries[:, :2]))

    run_ranks(world, body)


def test_each_operation_reports_its_use_before_running() -> None:
    world = 2
    sig = TransportSignature("bf16", 4, 8, 6, world, max_tokens=2)

    def body(member: Member) -> list[tuple[str, torch.dtype]]:
        seen: list[tuple[str, torch.dtype]] = []
        transport = _transport(sig, member, "ag_rs", uses=lambda op, dt: seen.append((op, dt)))
        transport.gather_queries(torch.zeros(1, 2, 8, dtype=torch.bfloat16))
        parts = make_partials(world, 1, 4, 6, torch.bfloat16, pattern="random", seed=1)
        transport.reduce_outputs(*parts.of_rank(member.rank))
        transport.gather_queries(torch.zeros(2, 2, 8, dtype=torch.bfloat16))  # not a first use
        transport.reduce_outputs(*parts.of_rank(member.rank))
        return seen

    for seen in run_ranks(world, body):
        assert seen == [("gather", torch.bfloat16), ("reduce", torch.bfloat16)]


def test_a_refused_use_stops_the_operation_before_its_collective() -> None:
    """Every rank refuses (as a strict window does on each): no rank enters the exchange, so
    nothing hangs and nothing is written."""
    world = 2
    sig = TransportSignature("bf16", 4, 8, 6, world, max_tokens=2)

    def refuse(op: str, dtype: torch.dtype) -> None:
        raise RuntimeError(f"lazy {op}")

    def body(member: Member) -> None:
        transport = _transport(sig, member, "a2a", uses=refuse)
        out = torch.full((1, 2, 6), 3.0, dtype=torch.bfloat16)
        with pytest.raises(RuntimeError, match="lazy reduce"):
            transport.reduce_outputs(
                torch.zeros(1, 4, 6, dtype=torch.bfloat16), torch.zeros(1, 4), out=out
            )
        assert (out == 3.0).all()
        for _ in range(2):  # refused, so still a first use the next time
            with pytest.raises(RuntimeError, match="lazy gather"):
                transport.gather_queries(torch.zeros(1, 2, 8, dtype=torch.bfloat16))

    run_ranks(world, body)


def _shift_without_max(work, peak, base_e):
    return work.exp_() if base_e else work.exp2_()


@pytest.mark.parametrize(
    ("step", "broken"),
    [
        ("sanitize_into", lambda work, lses: work.copy_(lses)),
        ("shift_by_max", _shift_without_max),
    ],
    ids=["NaN kept as an LSE", "no max subtraction"],
)
@pytest.mark.parametrize("impl", ["ag_rs", "a2a"])
def test_a_broken_weights_step_fails_the_transport_against_the_reference(
    step, broken, impl, monkeypatch
) -> None:
    """The transports' weights (`harness.transport.weights`) share no code with the oracle or
    the reference, so a wrong step there is a failure the reference finds in the transport."""
    from harness.transport import weights

    monkeypatch.setattr(weights, step, broken)
    world = 2
    sig = TransportSignature("fp32", 4, 8, 6, world, max_tokens=2)

    def body(member: Member) -> int:
        transport = _transport(sig, member, impl)
        wrong = 0
        for pattern in ("nan_inf", "huge_offset"):
            parts = make_partials(world, 2, 4, 6, torch.float32, pattern=pattern, seed=8)
            got = transport.reduce_outputs(*parts.of_rank(member.rank))
            try:
                assert_matches(got, parts.expected(member.rank), what=pattern)
            except AssertionError:
                wrong += 1
        return wrong

    assert all(wrong > 0 for wrong in run_ranks(world, body))


def _multiply_then_fill(dst, outputs, weights):
    """AG+RS's scaling step as it was before the mask moved into the select (the pin)."""
    w = weights.unsqueeze(-1)
    torch.mul(outputs, w, out=dst)
    return dst.masked_fill_(w == 0, 0.0)


def _accumulate_selected(acc, outputs, weights):
    """A2A's accumulation as it was before: a select per shard, then addcmul (the pin)."""
    zero = torch.zeros((), dtype=outputs.dtype)
    for shard, weight in zip(outputs, weights.unsqueeze(-1), strict=True):
        acc.addcmul_(torch.where(weight > 0, shard, zero), weight)
    return acc


class _StagedSelected:
    """`StagedAccumulation`'s interface on the former step: fresh zeros, then the pin."""

    def __init__(self, acc, outputs, *, weights, **staging) -> None:
        self.shape, self.outputs, self.weights = acc.shape, outputs, weights

    def accumulate(self):
        return _accumulate_selected(torch.zeros(self.shape), self.outputs, self.weights)


class _OracleWeights:
    """`StagedWeights`' interface on the former weights: the oracle's `combine_weights`."""

    def __init__(self, *, out, row=None, **scratch) -> None:
        self.out, self.row = out, row

    def __call__(self, lses, *, base_e=True):
        weights = combine.combine_weights(lses, base_e=base_e).weights
        return self.out.copy_(weights if self.row is None else weights[self.row])


PINS = {
    "ag_rs": ("scale_into", _multiply_then_fill),
    "ag_rs_a2a": ("scale_into", _multiply_then_fill),
    "a2a": ("StagedAccumulation", _StagedSelected),
}


@pytest.mark.parametrize("impl", list(PINS))
def test_each_reduction_gives_the_bits_of_its_former_local_step(impl, monkeypatch) -> None:
    """The whole reduction, every pattern, both bases, bf16 and fp32, at 4 ranks: the same
    bits as with the former scaling (AG+RS) or accumulation (A2A) step and the oracle's
    weights patched in."""
    world = 4
    runs: dict[str, list[list[torch.Tensor]]] = {}
    name_of_step, former = PINS[impl]
    now = (getattr(torch_backend, name_of_step), torch_backend.StagedWeights)
    for name, (step, weigh) in (("now", now), ("before", (former, _OracleWeights))):
        monkeypatch.setattr(torch_backend, name_of_step, step)
        monkeypatch.setattr(torch_backend, "StagedWeights", weigh)

        def body(member: Member) -> list[torch.Tensor]:
            got = []
            for dtype in ("bf16", "fp32"):
                sig = TransportSignature(dtype, 2 * world, 8, 6, world, max_tokens=3)
                transport = _transport(sig, member, impl)
                for pattern in PATTERNS:
                    parts = make_partials(
                        world, 3, 2 * world, 6, output_torch_dtype(sig), pattern=pattern, seed=9
                    )
                    for base_e in (True, False):
                        mine = parts.of_rank(member.rank)
                        got.append(transport.reduce_outputs(*mine, base_e=base_e))
            return got

        runs[name] = run_ranks(world, body)
    for rank, (now, before) in enumerate(zip(runs["now"], runs["before"], strict=True)):
        assert all(bit_equal(a, b) for a, b in zip(now, before, strict=True)), f"rank {rank}"


@pytest.mark.parametrize("group_bytes", [1, 2 * 2 * 6 * 4], ids=["one_source", "two_sources"])
def test_a2a_gives_the_same_bits_whatever_its_group_and_batch_order(
    group_bytes, monkeypatch
) -> None:
    """A2A's staging upcasts and masks several source ranks per op (all 4 here by default);
    one or two at a time give the same bits. Batches come in mixed order and repeat with new
    data, so a batch's kept views never serve another batch or keep a former call's values."""
    world, batches = 4, (2, 1, 3, 2, 1)
    sig = TransportSignature("bf16", 2 * world, 8, 6, world, max_tokens=3)
    runs: dict[int, list[list[torch.Tensor]]] = {}
    for cap in (torch_backend._A2A_GROUP_BYTES, group_bytes):
        monkeypatch.setattr(torch_backend, "_A2A_GROUP_BYTES", cap)

        def body(member: Member) -> list[torch.Tensor]:
            transport, got = _transport(sig, member, "a2a"), []
            for i, batch in enumerate(batches):
                for pattern in PATTERNS:
                    parts = make_partials(
                        world, batch, 2 * world, 6, torch.bfloat16, pattern=pattern, seed=i
                    )
                    got.append(transport.reduce_outputs(*parts.of_rank(member.rank)))
                    assert_matches(got[-1], parts.expected(member.rank), what=pattern)
            return got

        runs[cap] = run_ranks(world, body)
    default, other = runs.values()
    for rank, (a, b) in enumerate(zip(default, other, strict=True)):
        assert all(bit_equal(x, y) for x, y in zip(a, b, strict=True)), f"rank {rank}"


def test_a2a_staging_takes_as_many_sources_as_fit_and_is_sized_once_for_the_largest() -> None:
    """Kimi-K3 DCP16 shapes: 12 KiB of fp32 per source rank and token, 512 KiB per group."""
    assert [torch_backend.a2a_group(b, 6, 512, 16) for b in (1, 2, 3, 8, 42, 43, 64)] == [
        16, 16, 14, 5, 1, 1, 1,
    ]  # fmt: skip
    assert torch_backend.a2a_group(1, 1, 1, 4) == 4
    sig = TransportSignature("bf16", 96, 576, 512, 16, max_tokens=8)

    def body(member: Member) -> dict[str, int]:
        return dict(_transport(sig, member, "a2a").buffers)

    row = 6 * 512 * 4  # one token of one source rank's heads, fp32
    for buffers in run_ranks(16, body):
        # Batches 3, 6 and 7 stage 42 token-rows (14 * 3, 7 * 6, 6 * 7), the most of any.
        assert buffers["a2a_scratch"] == 42 * row
        assert buffers["a2a_acc"] == 8 * row
        assert buffers["a2a_weights"] == 16 * 8 * 6 * 4
        assert buffers["a2a_keep"] == 16 * 8 * 6 * 2  # as wide as a bf16 output


def test_the_reduction_s_lses_are_base_e_by_default() -> None:
    """`reduce_outputs` without `base_e` combines natural-log LSEs (what vLLM's attention
    returns); the random pattern's two bases give different results, so base 2 would fail."""
    world = 2
    sig = TransportSignature("fp32", 4, 8, 6, world, max_tokens=2)
    parts = make_partials(world, 2, 4, 6, torch.float32, pattern="random", seed=13)

    def body(member: Member) -> None:
        got = _transport(sig, member, "ag_rs").reduce_outputs(*parts.of_rank(member.rank))
        assert_matches(got, parts.expected(member.rank, base_e=True), what="default base")
        with pytest.raises(AssertionError):  # the control: the bases are told apart here
            assert_matches(got, parts.expected(member.rank, base_e=False))

    run_ranks(world, body)


BAD_OUTS = {
    "dtype": lambda: torch.zeros(1, 2, 6, dtype=torch.float32),
    "shape": lambda: torch.zeros(1, 4, 6, dtype=torch.bfloat16),
    "device": lambda: torch.zeros(1, 2, 6, dtype=torch.bfloat16, device="meta"),
}


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("bad", list(BAD_OUTS))
def test_a_wrong_out_is_refused_before_the_use_and_the_exchange(impl, bad) -> None:
    """An `out` of the wrong dtype, shape (all heads instead of this rank's) or device is a
    usage error on every rank: nothing reported as used, no collective entered, not a cast
    or a broadcast into the caller's tensor."""
    world = 2
    sig = TransportSignature("bf16", 4, 8, 6, world, max_tokens=2)
    parts = make_partials(world, 1, 4, 6, torch.bfloat16, pattern="random", seed=4)

    def body(member: Member) -> list[tuple[str, torch.dtype]]:
        seen: list[tuple[str, torch.dtype]] = []
        transport = _transport(sig, member, impl, uses=lambda op, dt: seen.append((op, dt)))
        out = BAD_OUTS[bad]()
        with pytest.raises(TransportUsageError, match=r"out \[B, h, odim\]"):
            transport.reduce_outputs(*parts.of_rank(member.rank), out=out)
        if out.device.type != "meta":
            assert (out == 0).all()
        return seen

    assert run_ranks(world, body) == [[], []]


@pytest.mark.parametrize("default", [torch.float64, torch.bfloat16])
def test_the_a2a_reduction_ignores_torch_s_default_dtype(default: torch.dtype) -> None:
    """The A2A accumulator is fp32 (the weights' dtype) whatever torch's default dtype (a
    model loader may set bf16): the same bits as under the usual default, and the reference's
    values. A bf16 accumulator over 4 ranks misses the fp32 tolerance; an fp64 one changes bits."""
    world = 4
    sig = TransportSignature("fp32", 2 * world, 8, 6, world, max_tokens=3)
    parts = make_partials(world, 3, 2 * world, 6, torch.float32, pattern="random", seed=21)
    inputs = [parts.of_rank(rank) for rank in range(world)]  # drawn under the usual default

    def body(member: Member) -> torch.Tensor:
        return _transport(sig, member, "a2a").reduce_outputs(*inputs[member.rank])

    usual = run_ranks(world, body)
    before = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        under_default = run_ranks(world, body)
    finally:
        torch.set_default_dtype(before)
    for rank, (got, want) in enumerate(zip(under_default, usual, strict=True)):
        assert_matches(got, parts.expected(rank), what=f"rank {rank}")
        assert bit_equal(got, want), f"rank {rank}: the default dtype changed the bits"


def test_the_a2a_reduction_ignores_torch_s_default_device() -> None:
    """The A2A accumulator lives on the result's device, not torch's default one: a CUDA
    transport must not accumulate on the CPU. `meta` as the default device stands in for a
    device other than the transport's on a CPU-only machine."""
    world = 2
    sig = TransportSignature("bf16", 4, 8, 6, world, max_tokens=2)
    parts = make_partials(world, 2, 4, 6, torch.bfloat16, pattern="mixed", seed=17)

    def body(member: Member) -> torch.Tensor:
        transport = _transport(sig, member, "a2a")
        mine = parts.of_rank(member.rank)
        with torch.device("meta"):
            return transport.reduce_outputs(*mine)

    for rank, got in enumerate(run_ranks(world, body)):
        assert got.device.type == "cpu"
        assert_matches(got, parts.expected(rank), what=f"rank {rank}")


@pytest.mark.parametrize("impl", list(IMPLS))
def test_tp9_padded_heads_travel_in_place(impl) -> None:
    """Kimi-K3 at TP9/DCP9: 11 local heads, 99 gathered, the last rank's 3 tail heads padding
    (zero queries). The transport moves every row, padding in place after the 96 real heads,
    and reduces each rank's heads (padding included) as the reference does."""
    world, local, real = 9, 11, 96
    sig = TransportSignature("bf16", local * world, 16, 8, world, max_tokens=2)
    queries = make_queries(world, 2, local, 16, torch.bfloat16, seed=9)
    queries[world - 1, :, real - local * (world - 1) :] = 0  # the tail padding
    parts = make_partials(world, 2, sig.total_heads, 8, torch.bfloat16, pattern=PATTERNS[0], seed=9)

    def body(member: Member) -> None:
        transport = _transport(sig, member, impl)
        got = transport.gather_queries(queries[member.rank].contiguous())
        assert got.shape == (2, 99, 16) and bit_equal(got, expected_gather(queries))
        assert not got[:, real:].any() and got[:, :real].any()
        reduced = transport.reduce_outputs(*parts.of_rank(member.rank))
        assert reduced.shape == (2, local, 8)
        assert_matches(reduced, parts.expected(member.rank, base_e=True), what="tp9")

    run_ranks(world, body)
