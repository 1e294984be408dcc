"""Input checks shared by every transport backend, so both reject the same inputs the same way.

Messages carry the signature and the offending values. A batch above max_tokens raises
`CapacityError`: the static staging cannot hold it, and reallocating would be lazy work.
"""

from __future__ import annotations

import torch

from harness.transport.errors import CapacityError, TransportUsageError
from harness.warm.signature import TransportSignature, output_torch_dtype, query_torch_dtype


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


def check_gather(
    sig: TransportSignature,
    q_local: torch.Tensor,
    out: torch.Tensor | None,
    device: torch.device,
) -> int:
    """Validate `gather_queries` arguments; returns the batch size."""
    op = "gather_queries"
    _dims(sig, op, "q_local", q_local, 3)
    batch = int(q_local.shape[0])
    check_batch(sig, op, batch)
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
    _dims(sig, op, "partial_out", partial_out, 3)
    batch = int(partial_out.shape[0])
    check_batch(sig, op, batch)
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
