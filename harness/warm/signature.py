"""The transport signature, as the vendored warm code imports it, plus the torch dtype mapping.

The signature itself is torch-free and lives in `harness.core.signature`; this module re-exports
it and maps its dtype names to torch dtypes (and, for gloo, which has no fp8, to the dtype a
transport moves on the wire).
"""

from __future__ import annotations

import torch

from harness.core.signature import (
    COMM_BACKENDS,
    DEFAULT_COMM_BACKEND,
    DEFAULT_MAX_TOKENS,
    FP8_E4M3,
    OUTPUT_DTYPES,
    QUERY_DTYPES,
    TransportSignature,
    check_dtype_name,
)
from harness.errors import UsageError

__all__ = [
    "COMM_BACKENDS",
    "DEFAULT_COMM_BACKEND",
    "DEFAULT_MAX_TOKENS",
    "DTYPES",
    "DTYPE_NAMES",
    "FP8_E4M3",
    "MODEL_DTYPES",
    "OUTPUT_DTYPES",
    "QUERY_DTYPES",
    "TransportSignature",
    "dtype_name",
    "output_torch_dtype",
    "query_torch_dtype",
    "torch_dtype",
    "wire_dtype",
]

# Every dtype name a signature can carry, mapped to torch.
DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    FP8_E4M3: torch.float8_e4m3fn,
}
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
