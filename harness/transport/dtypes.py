"""Signature dtype names as torch dtypes, and what a collective moves for each.

The names and their torch attributes live in `harness.core.signature` (torch-free); this module
is their torch side, for the transport and the code around it (for gloo, which has no fp8, also
the dtype a transport moves on the wire).
"""

from __future__ import annotations

import torch

from harness.core.signature import (
    OUTPUT_DTYPES,
    QUERY_DTYPES,
    TORCH_DTYPE_ATTRS,
    TransportSignature,
    check_dtype_name,
)
from harness.errors import UsageError

# Every dtype name a signature can carry, mapped to torch.
DTYPES: dict[str, torch.dtype] = {k: getattr(torch, v) for k, v in TORCH_DTYPE_ATTRS.items()}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
# The model (output) dtypes a user can pick with --dtype.
MODEL_DTYPES: dict[str, torch.dtype] = {k: DTYPES[k] for k in OUTPUT_DTYPES}
assert set(DTYPES) == set(QUERY_DTYPES), "every signature dtype name has a torch dtype"


def dtype_name(dtype: torch.dtype | str) -> str:
    """Our short dtype name ('bf16', 'fp16', 'fp32', 'fp8_e4m3fn') for a torch dtype or name."""
    if isinstance(dtype, str):
        return check_dtype_name(dtype)
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise UsageError(f"unsupported dtype {dtype}; expected one of {sorted(DTYPES)}") from None


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES[check_dtype_name(name)]


def query_torch_dtype(signature: TransportSignature) -> torch.dtype:
    """The dtype of the queries a transport gathers."""
    return torch_dtype(str(signature.query_dtype))


def output_torch_dtype(signature: TransportSignature) -> torch.dtype:
    """The dtype of the partial outputs a transport reduces, and of its result."""
    return torch_dtype(signature.output_dtype)


def wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """What a collective moves for `dtype`: gloo has no fp8, so fp8 travels as its uint8 bytes
    (a view of the same storage, so the round trip is bit-exact)."""
    return torch.uint8 if dtype.itemsize == 1 and dtype.is_floating_point else dtype
