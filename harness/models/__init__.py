"""Stand-in vLLM model trees (Kimi-K3, DeepSeek-V4, generic MLA, mixed) with no real weights."""

from harness.core.choices import MODEL_CHOICES
from harness.models.builders import BuiltModel, ModelSpec, build, build_model

__all__ = ["MODEL_CHOICES", "BuiltModel", "ModelSpec", "build", "build_model"]
