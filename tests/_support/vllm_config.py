"""A real VllmConfig for the tiny Kimi-K3 tree, built in the test's own process (no ranks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_kimi_config(folder: Path) -> Any:
    """vLLM's config for Kimi-K3 at TP16/DCP16 over a tiny config.json written into `folder`."""
    from harness.models.real.builder import RealSpec, make_vllm_config
    from harness.models.real.configs import kimi_k3

    return make_vllm_config(RealSpec("kimi-k3", tp=16, dcp=16), kimi_k3().write(folder / "kimi"))
