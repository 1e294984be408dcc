"""`--warm-impl vllm`: qualify production's own warm function, the B12X fork's `kernel_warmup`.

vLLM's GPU worker calls `kernel_warmup(worker)` before `model_runner.capture_model()`. This
adapter calls the same function with a worker shell whose `get_model()`, `vllm_config`,
`model_config` and `model_runner` (with `speculator.model`, the draft) are the real ones of a
real tree built on this rank, then reads the DCP pools where the fork keeps them and mirrors
each into our transport registry, so the capture oracle sees exactly what production warmed.

Every fork name is resolved at run time; where one is absent (upstream vLLM 0.32 has
`kernel_warmup` but no B12X DCP warm) the adapter refuses with one line: qualifying a warm
function that cannot create a DCP transport would qualify nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from harness.core.signature import TransportSignature
from harness.errors import UsageError
from harness.warm.protocols import TransportRegistryLike
from harness.warm.recognizers import WarmContext
from harness.warm.warmup import WarmReport

WARMUP_MODULE = "vllm.model_executor.warmup.kernel_warmup"
ENTRY = "kernel_warmup"
DCP_WARM = "_warmup_b12x_dcp_a2a"  # the fork's DCP part of kernel_warmup
POOLS_MODULE = "vllm.v1.attention.ops.dcp_alltoall"
POOLS = "_B12X_DCP_A2A_POOLS"  # {(id(group), device_index, heads, odim, qdim, max_batch): pool}


@dataclass(frozen=True)
class Fork:
    """The fork's names, resolved."""

    kernel_warmup: Callable[..., Any]
    pools: Mapping[tuple[Any, ...], Any]


def _attr(module_name: str, name: str) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"--warm-impl vllm needs the B12X vLLM fork: cannot import {module_name} ({exc})"
        ) from None
    if not hasattr(module, name):
        raise UsageError(
            f"--warm-impl vllm needs the B12X vLLM fork: {module_name} has no {name} "
            "(this vLLM has no B12X DCP transport warm)"
        )
    return getattr(module, name)


def resolve_fork() -> Fork:
    """The fork's entry point and pool cache, or a one-line UsageError naming what is absent."""
    entry = _attr(WARMUP_MODULE, ENTRY)
    _attr(WARMUP_MODULE, DCP_WARM)
    return Fork(kernel_warmup=entry, pools=_attr(POOLS_MODULE, POOLS))


class ModelRunnerShell:
    """What `kernel_warmup` reads from `worker.model_runner`: the model and the drafter."""

    def __init__(self, model: nn.Module, draft: nn.Module | None, vllm_config: Any) -> None:
        self.model = model
        self.vllm_config = vllm_config
        self.speculator = _Speculator(draft) if draft is not None else None

    def get_model(self) -> nn.Module:
        return self.model


@dataclass
class _Speculator:
    model: nn.Module


class WorkerShell:
    """A GPU worker as `kernel_warmup(worker)` sees it, around a real tree's objects."""

    use_v2_model_runner = True  # the v1 KV-block zeroer needs an allocated KV cache

    def __init__(self, model: nn.Module, draft: nn.Module | None, vllm_config: Any) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.parallel_config = vllm_config.parallel_config
        self.scheduler_config = vllm_config.scheduler_config
        self.compilation_config = vllm_config.compilation_config
        self.model_runner = ModelRunnerShell(model, draft, vllm_config)

    def get_model(self) -> nn.Module:
        return self.model_runner.model


def pool_signature(key: tuple[Any, ...], context: WarmContext) -> TransportSignature:
    """The registry signature of one fork pool key (see `POOLS`)."""
    _, _, heads, odim, qdim, max_batch = key
    return TransportSignature(
        dtype=context.dtype,
        total_heads=int(heads),
        query_head_dim=int(qdim),
        output_head_dim=int(odim),
        dcp_world_size=context.dcp_world_size,
        max_tokens=int(max_batch),
        device_type=context.device_type,
    )


def _tree_of(model: nn.Module) -> Any:
    from harness.models.real import built_trees

    tree = next((t for t in built_trees() if t.target is model), None)
    if tree is None:
        raise UsageError("--warm-impl vllm qualifies vLLM's real trees only (--models real)")
    return tree


def warm_vllm(
    model: nn.Module,
    *,
    registry: TransportRegistryLike,
    context: WarmContext,
    group: Any = None,
    static_forward_context: Mapping[str, nn.Module] | None = None,
    fork: Fork | None = None,
) -> WarmReport:
    """Run the fork's `kernel_warmup` on a worker shell; mirror its pools into `registry`."""
    from vllm.config import set_current_vllm_config

    fork = fork or resolve_fork()
    tree = _tree_of(model)
    with set_current_vllm_config(tree.vllm_config):
        fork.kernel_warmup(WorkerShell(model, tree.draft, tree.vllm_config))
    # Every pool the process holds now is what production would have at capture time.
    created = sorted({pool_signature(k, context) for k in fork.pools})
    for signature in created:
        registry.get_or_create(signature, group)
    return WarmReport(
        recognizer_set="vllm", signatures=tuple(created), layers=(), per_kind={"vllm": 0}
    )
