"""Checks shared by every transport backend, so both reject the same calls the same way.

Messages carry the signature and the offending values. A batch above max_tokens raises
`CapacityError`: the static staging cannot hold it, and reallocating would be lazy work.
`OperationGuard` is what each backend does before an operation moves data.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from harness.core.signature import TransportSignature
from harness.transport.dtypes import output_torch_dtype, query_torch_dtype
from harness.transport.errors import CapacityError, RegistryClosedError, TransportUsageError

# Called with (operation, dtype) before an operation runs: "gather" or "reduce".
UseHook = Callable[[str, torch.dtype], None]


def _where(sig: TransportSignature, op: str) -> str:
    return f"{op} [{sig.describe()}]"


def check_batch(sig: TransportSignature, op: str, batch: int) -> None:
    if batch < 1:
        raise TransportUsageError(f"{_where(sig, op)}: batch must be at least 1, got {batch}")
    if batch > sig.max_tokens:
        raise CapacityError(
            f"{_where(sig, op)}: batch of {batch} tokens exceeds max_tokens={sig.max_tokens}; "
            "staging buffers are sized once at creation and never grow: create the transport "
            "with a larger max_tokens (max_num_batched_tokens) or split the batch"
        )


def _check_tensor(
    sig: TransportSignature,
    op: str,
    what: str,
    tensor: torch.Tensor,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TransportUsageError(f"{_where(sig, op)}: {what} must be a tensor, got {tensor!r}")
    if tuple(tensor.shape) != shape:
        raise TransportUsageError(
            f"{_where(sig, op)}: {what} must have shape {list(shape)}, got {list(tensor.shape)}"
        )
    if tensor.dtype != dtype:
        raise TransportUsageError(f"{_where(sig, op)}: {what} must be {dtype}, got {tensor.dtype}")
    if tensor.device.type != device.type or (
        device.index is not None and tensor.device.index not in (None, device.index)
    ):
        raise TransportUsageError(
            f"{_where(sig, op)}: {what} is on {tensor.device}, the transport on {device}"
        )


def _dims(sig: TransportSignature, op: str, what: str, tensor: torch.Tensor, ndim: int) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != ndim:
        got = list(tensor.shape) if isinstance(tensor, torch.Tensor) else repr(tensor)
        raise TransportUsageError(f"{_where(sig, op)}: {what} must be {ndim}-D, got {got}")


def _batch(sig: TransportSignature, op: str, what: str, tensor: torch.Tensor) -> int:
    """The batch of an operation's first input, a `[B, heads, dim]` tensor, checked."""
    _dims(sig, op, what, tensor, 3)
    batch = int(tensor.shape[0])
    check_batch(sig, op, batch)
    return batch


def check_gather(
    sig: TransportSignature,
    q_local: torch.Tensor,
    out: torch.Tensor | None,
    device: torch.device,
) -> int:
    """Validate `gather_queries` arguments; returns the batch size."""
    op = "gather_queries"
    batch = _batch(sig, op, "q_local", q_local)
    shape = (batch, sig.local_heads, sig.query_head_dim)
    _check_tensor(sig, op, "q_local [B, h, qdim]", q_local, shape, query_torch_dtype(sig), device)
    if out is not None:
        gathered = (batch, sig.total_heads, sig.query_head_dim)
        _check_tensor(sig, op, "out [B, H, qdim]", out, gathered, query_torch_dtype(sig), device)
    return batch


def check_reduce(
    sig: TransportSignature,
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor | None,
    device: torch.device,
) -> int:
    """Validate `reduce_outputs` arguments; returns the batch size."""
    op = "reduce_outputs"
    batch = _batch(sig, op, "partial_out", partial_out)
    shape = (batch, sig.total_heads, sig.output_head_dim)
    out_dtype = output_torch_dtype(sig)
    _check_tensor(sig, op, "partial_out [B, H, odim]", partial_out, shape, out_dtype, device)
    _dims(sig, op, "partial_lse", partial_lse, 2)
    lse_shape = (batch, sig.total_heads)
    _check_tensor(sig, op, "partial_lse [B, H]", partial_lse, lse_shape, torch.float32, device)
    if out is not None:
        reduced = (batch, sig.local_heads, sig.output_head_dim)
        _check_tensor(sig, op, "out [B, h, odim]", out, reduced, out_dtype, device)
    return batch


class OperationGuard:
    """Base of the transports: what each operation does before it moves data.

    `_begin_gather`/`_begin_reduce` refuse a closed transport, check the inputs, then report the
    first use of (operation, dtype) to the registry's hook, before the first collective: a
    strict capture window stops a lazy first use on every rank before any rank enters the
    exchange. A use is remembered only once accepted, so one a strict window refused is
    reported again next time."""

    signature: TransportSignature
    device: torch.device
    label = "transport"  # how a closed-transport error names it

    def __init__(self, on_use: UseHook | None) -> None:
        self.closed = False
        self._on_use = on_use
        self._ran: set[tuple[str, torch.dtype]] = set()  # uses already reported (fast path)

    def _begin_gather(self, q_local: torch.Tensor, out: torch.Tensor | None) -> int:
        """The batch of a valid gather on an open transport, its first use reported."""
        self._live()
        batch = check_gather(self.signature, q_local, out, self.device)
        self._report_use("gather", q_local.dtype)
        return batch

    def _begin_reduce(
        self, partial_out: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor | None
    ) -> int:
        """The batch of a valid reduction on an open transport, its first use reported."""
        self._live()
        batch = check_reduce(self.signature, partial_out, partial_lse, out, self.device)
        self._report_use("reduce", partial_out.dtype)
        return batch

    def _report_use(self, operation: str, dtype: torch.dtype) -> None:
        if self._on_use is not None and (operation, dtype) not in self._ran:
            self._on_use(operation, dtype)
            self._ran.add((operation, dtype))

    def _live(self) -> None:
        if self.closed:
            raise RegistryClosedError(f"{self.label} [{self.signature.describe()}] is closed")
