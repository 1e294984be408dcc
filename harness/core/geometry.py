"""Parallel geometry, validated where it is born (torchtitan's ParallelDims habit)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import GeometryError


def _positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise GeometryError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class ParallelGeometry:
    """Tensor parallel size `tp` split into decode-context-parallel groups of size `dcp`."""

    tp: int
    dcp: int

    def __post_init__(self) -> None:
        _positive("tp", self.tp)
        _positive("dcp", self.dcp)
        if self.tp % self.dcp:
            raise GeometryError(f"dcp={self.dcp} does not divide tp={self.tp}")

    def local_heads(self, num_heads: int, *, model: str = "model") -> int:
        """Heads per TP rank; the model's head count must split evenly over tp."""
        _positive("num_heads", num_heads)
        if num_heads % self.tp:
            raise GeometryError(
                f"{model} has {num_heads} attention heads, not divisible by tp={self.tp}"
            )
        return num_heads // self.tp

    def check_world_size(self, world_size: int) -> None:
        """A run of `world_size` ranks can host this geometry only as whole TP groups."""
        _positive("world_size", world_size)
        if world_size % self.tp:
            raise GeometryError(
                f"world size {world_size} cannot host tp={self.tp} (needs a multiple of tp)"
            )
