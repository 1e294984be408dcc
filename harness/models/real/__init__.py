"""vLLM 0.32's real model trees, built on CPU ranks from tiny configs with named shims."""

from harness.models.real.builder import RealSpec, RealTree, build_real, built_trees, planned_spec

__all__ = ["RealSpec", "RealTree", "build_real", "built_trees", "planned_spec"]
