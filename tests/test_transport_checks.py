"""Every transport refuses a bad call with the same words: the operation, the signature and
the offending value, before any data moves. The messages are what a user reads when a model
calls the transport wrongly, so each is pinned in full."""

from __future__ import annotations

import pytest
import torch

from harness.core.signature import TransportSignature
from harness.transport.checks import OperationGuard, check_batch, check_gather, check_reduce
from harness.transport.errors import CapacityError, RegistryClosedError, TransportUsageError

SIG = TransportSignature("bf16", 8, 576, 512, 2, max_tokens=4)  # 4 local heads of 8
CPU = torch.device("cpu")
GATHER = f"gather_queries [{SIG.describe()}]"
REDUCE = f"reduce_outputs [{SIG.describe()}]"


def q(batch: int = 2, heads: int = 4, dim: int = 576, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.zeros(batch, heads, dim, dtype=dtype)


def partial(batch: int = 2, heads: int = 8, dim: int = 512, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.zeros(batch, heads, dim, dtype=dtype)


def lse(batch: int = 2, heads: int = 8, dtype=torch.float32) -> torch.Tensor:
    return torch.zeros(batch, heads, dtype=dtype)


def refusal(call) -> str:
    with pytest.raises(TransportUsageError) as caught:
        call()
    return str(caught.value)


def test_valid_calls_return_their_batch() -> None:
    assert check_gather(SIG, q(3), None, CPU) == 3
    assert check_gather(SIG, q(3), torch.zeros(3, 8, 576, dtype=torch.bfloat16), CPU) == 3
    assert check_reduce(SIG, partial(4), lse(4), None, CPU) == 4
    assert check_reduce(SIG, partial(4), lse(4), partial(4, heads=4), CPU) == 4


def test_a_batch_outside_one_to_max_tokens_is_refused_in_full() -> None:
    assert refusal(lambda: check_batch(SIG, "gather_queries", 0)) == (
        f"{GATHER}: batch must be at least 1, got 0"
    )
    with pytest.raises(CapacityError) as caught:
        check_batch(SIG, "reduce_outputs", 5)
    assert str(caught.value) == (
        f"{REDUCE}: batch of 5 tokens exceeds max_tokens=4; staging buffers are sized once at "
        "creation and never grow: create the transport with a larger max_tokens "
        "(max_num_batched_tokens) or split the batch"
    )
    check_batch(SIG, "gather_queries", 4)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: check_gather(SIG, "q", None, CPU), f"{GATHER}: q_local must be 3-D, got 'q'"),
        (lambda: check_gather(SIG, lse(), None, CPU), f"{GATHER}: q_local must be 3-D, got [2, 8]"),
        (lambda: check_gather(SIG, q(0), None, CPU), f"{GATHER}: batch must be at least 1, got 0"),
        (
            lambda: check_gather(SIG, q(heads=8), None, CPU),
            f"{GATHER}: q_local [B, h, qdim] must have shape [2, 4, 576], got [2, 8, 576]",
        ),
        (
            lambda: check_gather(SIG, q(dtype=torch.float16), None, CPU),
            f"{GATHER}: q_local [B, h, qdim] must be torch.bfloat16, got torch.float16",
        ),
        (
            lambda: check_gather(SIG, q(), "out", CPU),
            f"{GATHER}: out [B, H, qdim] must be a tensor, got 'out'",
        ),
        (
            lambda: check_gather(SIG, q(), q(), CPU),
            f"{GATHER}: out [B, H, qdim] must have shape [2, 8, 576], got [2, 4, 576]",
        ),
        (
            lambda: check_reduce(SIG, lse(), lse(), None, CPU),
            f"{REDUCE}: partial_out must be 3-D, got [2, 8]",
        ),
        (
            lambda: check_reduce(SIG, partial(heads=4), lse(), None, CPU),
            f"{REDUCE}: partial_out [B, H, odim] must have shape [2, 8, 512], got [2, 4, 512]",
        ),
        (
            lambda: check_reduce(SIG, partial(), partial(), None, CPU),
            f"{REDUCE}: partial_lse must be 2-D, got [2, 8, 512]",
        ),
        (
            lambda: check_reduce(SIG, partial(), "lse", None, CPU),
            f"{REDUCE}: partial_lse must be 2-D, got 'lse'",
        ),
        (
            lambda: check_reduce(SIG, partial(), lse(heads=4), None, CPU),
            f"{REDUCE}: partial_lse [B, H] must have shape [2, 8], got [2, 4]",
        ),
        (
            lambda: check_reduce(SIG, partial(), lse(dtype=torch.bfloat16), None, CPU),
            f"{REDUCE}: partial_lse [B, H] must be torch.float32, got torch.bfloat16",
        ),
        (
            lambda: check_reduce(SIG, partial(), lse(), partial(), CPU),
            f"{REDUCE}: out [B, h, odim] must have shape [2, 4, 512], got [2, 8, 512]",
        ),
        (
            lambda: check_gather(SIG, q().to("meta"), None, CPU),
            f"{GATHER}: q_local [B, h, qdim] is on meta, the transport on cpu",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_each_bad_argument_is_refused_with_the_operation_the_signature_and_the_value(
    call, message
) -> None:
    assert refusal(call) == message


def test_a_device_index_is_compared_only_where_both_sides_have_one() -> None:
    indexed = torch.device("cpu", 0)
    assert check_gather(SIG, q(), None, indexed) == 2  # a CPU tensor carries no index
    assert check_reduce(SIG, partial(), lse(), None, indexed) == 2


class Guard(OperationGuard):
    signature = SIG
    device = CPU


def test_a_guard_starts_open_checks_out_and_names_itself_when_closed() -> None:
    uses: list[tuple[str, torch.dtype]] = []
    guard = Guard(lambda op, dtype: uses.append((op, dtype)))
    assert guard.closed is False
    assert "out [B, H, qdim] must have shape" in refusal(lambda: guard._begin_gather(q(), q()))
    assert uses == []  # a refused call is not a use
    assert guard._begin_gather(q(), None) == 2
    assert uses == [("gather", torch.bfloat16)]
    guard.closed = True
    with pytest.raises(RegistryClosedError) as caught:
        guard._begin_reduce(partial(), lse(), None)
    assert str(caught.value) == f"transport [{SIG.describe()}] is closed"
