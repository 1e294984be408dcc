"""Bus bandwidth of a collective, the nccl-tests way, and its share of one PCIe Gen5 x16 link.

nccl-tests' `busbw` turns a collective's time into the per-link rate a ring would need, so it can
be compared with the hardware's link speed: `algbw = size / time`, `busbw = algbw * (n-1)/n` for
all-gather (size = the gathered output), reduce-scatter (size = the full input) and all-to-all
(size = what one rank sends). The target hosts are PCIe only; a Gen5 x16 link carries about
64 GB/s per direction in theory (32 GT/s x 16 lanes, 128b/130b), which is the reference here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from harness.errors import UsageError

PCIE_GEN5_X16_BYTES_PER_S = 64e9  # per direction, theoretical
KINDS: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_to_all")


def collective_kind(op: str) -> str:
    """Which collective a bench op name stands for (ops are named by what they move)."""
    if op.startswith("ag_"):
        return "all_gather"
    if op.startswith("rs_"):
        return "reduce_scatter"
    if op.startswith("a2a_"):
        return "all_to_all"
    raise UsageError(f"no collective kind for op {op!r}")


def bus_bytes(kind: str, send: int, recv: int, world: int) -> float:
    """Bytes a ring moves per link for one collective of this size (size * (n-1)/n)."""
    if kind not in KINDS:
        raise UsageError(f"unknown collective kind {kind!r}; expected one of {KINDS}")
    if world < 1:
        raise UsageError(f"world size must be >= 1, got {world}")
    size = recv if kind == "all_gather" else send
    return size * (world - 1) / world


@dataclass(frozen=True)
class Bandwidth:
    """One op's bus bandwidth at its median time, and its fraction of a PCIe Gen5 x16 link."""

    op: str
    bus_bytes: float
    seconds: float
    busbw_gb_s: float
    pcie_gen5_x16_fraction: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def bandwidth(op: str, nbytes: float, seconds: float) -> Bandwidth:
    if seconds <= 0:
        raise UsageError(f"bandwidth of {op}: time must be > 0, got {seconds}")
    rate = nbytes / seconds
    return Bandwidth(op, nbytes, seconds, rate / 1e9, rate / PCIE_GEN5_X16_BYTES_PER_S)
