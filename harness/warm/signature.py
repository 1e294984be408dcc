"""The transport signature: the identity of one DCP transport that warmup must create.

Production keys B12X DCP transports by (device, dtype, total_heads, query_head_dim,
output_head_dim) with the max batch fixed by `max_num_batched_tokens`; the DCP world size
enters through total_heads. We keep `dcp_world_size` explicit so that local heads can be
derived and checked, and so that a signature names its own collective.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from harness.errors import GeometryError, UsageError

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}

DEFAULT_MAX_TOKENS = 64


def dtype_name(dtype: torch.dtype | str) -> str:
    """Our short dtype name ('bf16', 'fp16', 'fp32') for a torch dtype or a short name."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise UsageError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
        return dtype
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise UsageError(f"unsupported dtype {dtype}; expected one of {sorted(DTYPES)}") from None


@dataclass(frozen=True, order=True)
class TransportSignature:
    """One distinct DCP query-gather + output-reduction transport.

    Field order is the sort order, so discovery output is deterministic.
    """

    dtype: str
    total_heads: int
    query_head_dim: int
    output_head_dim: int
    dcp_world_size: int
    max_tokens: int = DEFAULT_MAX_TOKENS
    device_type: str = "cpu"

    SCHEMA: ClassVar[str] = "dcpqual-signature/v1"

    def __post_init__(self) -> None:
        dtype_name(self.dtype)  # validates
        for field in ("total_heads", "query_head_dim", "output_head_dim", "dcp_world_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GeometryError(f"{field} must be a positive integer, got {value!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise GeometryError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.total_heads % self.dcp_world_size:
            raise GeometryError(
                f"total_heads={self.total_heads} is not divisible by "
                f"dcp_world_size={self.dcp_world_size}"
            )
        if self.device_type not in ("cpu", "cuda"):
            raise GeometryError(f"device_type must be 'cpu' or 'cuda', got {self.device_type!r}")

    @property
    def local_heads(self) -> int:
        """Query heads each rank owns before the gather (and after the reduction)."""
        return self.total_heads // self.dcp_world_size

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def describe(self) -> str:
        """Short human form used in logs and error messages."""
        return (
            f"{self.total_heads} heads x {self.query_head_dim} -> {self.output_head_dim} "
            f"({self.dtype}, dcp={self.dcp_world_size}, max_tokens={self.max_tokens}, "
            f"{self.device_type})"
        )

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["local_heads"] = self.local_heads
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TransportSignature:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"dtype", "total_heads", "query_head_dim", "output_head_dim", "dcp_world_size"}
        missing -= data.keys()
        if missing:
            raise UsageError(f"transport signature is missing {sorted(missing)}")
        sig = cls(**{k: v for k, v in data.items() if k in names})
        if "local_heads" in data and data["local_heads"] != sig.local_heads:
            raise UsageError(
                f"transport signature local_heads={data['local_heads']} does not match "
                f"total_heads/dcp_world_size={sig.local_heads}"
            )
        return sig
