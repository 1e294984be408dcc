"""The transport signature: the identity of one DCP transport that warmup must create.

Production keys B12X DCP transports by device, dtypes, total_heads, query_head_dim,
output_head_dim and a token capacity; the DCP world size enters through total_heads. What a
layer hands the transport can differ between the gather and the reduction: under an fp8 KV
cache, vLLM's Kimi-K3 layer gathers `float8_e4m3fn` queries and reduces outputs in the model
dtype, so the query dtype and the output dtype are separate fields. `dtype` keeps its old name
and means the output dtype (JSON written before the split stays readable, and its meaning does
not change). `comm_backend` is vLLM's `parallel_config.dcp_comm_backend`: it decides which
collectives run the reduction (all-gather + reduce-scatter, or all-to-all), so two layers that
differ only in it need two transports. `dcp_world_size` is kept explicit so that local heads can
be derived and checked, and so that a signature names its own collective.

Dtypes are names here (torch-free), each with the name of its torch attribute
(`TORCH_DTYPE_ATTRS`); `harness.transport.dtypes` maps them to torch dtypes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from harness.errors import GeometryError, UsageError

# Short names of the dtypes a transport can move. Reductions run in a floating model dtype;
# the query gather also moves fp8 (e4m3, finite-only: torch.float8_e4m3fn) queries, bit-exact.
OUTPUT_DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp32")
FP8_E4M3 = "fp8_e4m3fn"
QUERY_DTYPES: tuple[str, ...] = (*OUTPUT_DTYPES, FP8_E4M3)
# Each dtype name's attribute of the `torch` module, so code that has torch needs no table.
TORCH_DTYPE_ATTRS: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    FP8_E4M3: "float8_e4m3fn",
}

# vLLM's `parallel_config.dcp_comm_backend` values; "ag_rs" is vLLM's default.
COMM_BACKENDS: tuple[str, ...] = ("ag_rs", "a2a")
DEFAULT_COMM_BACKEND: Final = "ag_rs"

DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda")
DEFAULT_MAX_TOKENS = 64


def check_dtype_name(name: object, *, allowed: tuple[str, ...] = QUERY_DTYPES) -> str:
    """`name` if it is one of `allowed` (a UsageError naming the choices otherwise)."""
    if not isinstance(name, str) or name not in allowed:
        raise UsageError(f"unknown dtype {name!r}; expected one of {sorted(allowed)}")
    return name


def _positive(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise GeometryError(f"{field} must be a positive integer, got {value!r}")


@dataclass(frozen=True, order=True)
class TransportSignature:
    """One distinct DCP query-gather + output-reduction transport.

    Field order is the sort order, so discovery output is deterministic. `query_dtype=None`
    means "the same as `dtype`" and is normalized at construction, so equal transports compare
    and hash equal however they were spelled.
    """

    dtype: str  # the output (reduction) dtype
    total_heads: int
    query_head_dim: int
    output_head_dim: int
    dcp_world_size: int
    max_tokens: int = DEFAULT_MAX_TOKENS
    device_type: str = "cpu"
    query_dtype: str | None = None
    comm_backend: str = DEFAULT_COMM_BACKEND

    SCHEMA: ClassVar[str] = "dcpqual-signature/v1"  # fields only added since v1

    def __post_init__(self) -> None:
        check_dtype_name(self.dtype, allowed=OUTPUT_DTYPES)
        if self.query_dtype is None:
            object.__setattr__(self, "query_dtype", self.dtype)
        check_dtype_name(self.query_dtype)
        for field in ("total_heads", "query_head_dim", "output_head_dim", "dcp_world_size"):
            _positive(field, getattr(self, field))
        _positive("max_tokens", self.max_tokens)
        if self.total_heads % self.dcp_world_size:
            raise GeometryError(
                f"total_heads={self.total_heads} is not divisible by "
                f"dcp_world_size={self.dcp_world_size}"
            )
        if self.device_type not in DEVICE_TYPES:
            raise GeometryError(f"device_type must be 'cpu' or 'cuda', got {self.device_type!r}")
        if self.comm_backend not in COMM_BACKENDS:
            raise GeometryError(
                f"comm_backend must be one of {COMM_BACKENDS}, got {self.comm_backend!r}"
            )

    @property
    def output_dtype(self) -> str:
        """The dtype of the partial outputs and of the reduced result (same as `dtype`)."""
        return self.dtype

    @property
    def local_heads(self) -> int:
        """Query heads each rank owns before the gather (and after the reduction)."""
        return self.total_heads // self.dcp_world_size

    def describe(self) -> str:
        """Short human form used in logs and error messages.

        The query dtype and the comm backend appear only where they differ from the defaults,
        so the common case reads as it always did.
        """
        dtypes = self.dtype if self.query_dtype == self.dtype else f"{self.query_dtype} -> "
        if self.query_dtype != self.dtype:
            dtypes += self.dtype
        backend = "" if self.comm_backend == DEFAULT_COMM_BACKEND else f", {self.comm_backend}"
        return (
            f"{self.total_heads} heads x {self.query_head_dim} -> {self.output_head_dim} "
            f"({dtypes}, dcp={self.dcp_world_size}, max_tokens={self.max_tokens}, "
            f"{self.device_type}{backend})"
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON form ("dcpqual-signature/v1"), read back by `harness.schema.signature`."""
        data = dataclasses.asdict(self)
        data["local_heads"] = self.local_heads
        return data
