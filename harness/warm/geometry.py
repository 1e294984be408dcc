"""Re-export of `harness.core.geometry`, where the parallel geometry now lives (torch-free)."""

from harness.core.geometry import ParallelGeometry

__all__ = ["ParallelGeometry"]
