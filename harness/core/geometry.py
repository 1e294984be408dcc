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
        """Heads per TP rank: `ceil(num_heads / tp)`, the tail padded as the fork pads Kimi-K3
        (`original_num_attention_heads`): 96 heads at TP9 are 11 per rank, 99 in all, the last
        three padding. A tp so large that a whole rank would hold only padding is refused."""
        _positive("num_heads", num_heads)
        local = -(-num_heads // self.tp)
        if local * (self.tp - 1) >= num_heads:
            raise GeometryError(
                f"{model} has {num_heads} attention heads: at tp={self.tp} ({local} per rank) "
                "a whole rank would hold only padding heads"
            )
        return local

    def padded_heads(self, num_heads: int, *, model: str = "model") -> int:
        """Heads over all TP ranks, padding included (99 for 96 heads at TP9)."""
        return self.local_heads(num_heads, model=model) * self.tp

    def real_local_heads(self, num_heads: int, tp_rank: int) -> int:
        """How many of TP rank `tp_rank`'s local heads are real (the rest are tail padding)."""
        if not 0 <= tp_rank < self.tp:
            raise GeometryError(f"tp rank {tp_rank} is outside tp={self.tp}")
        local = self.local_heads(num_heads)
        return max(0, min(local, num_heads - tp_rank * local))

    def check_world_size(self, world_size: int) -> None:
        """A run of `world_size` ranks can host this geometry only as whole TP groups."""
        _positive("world_size", world_size)
        if world_size % self.tp:
            raise GeometryError(
                f"world size {world_size} cannot host tp={self.tp} (needs a multiple of tp)"
            )
