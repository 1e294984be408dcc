"""Build vLLM 0.32's real model trees on a rank, inside the run's own process group.

The recipe is vLLM's own: a `VllmConfig` from a tiny local config.json, `set_current_vllm_config`,
`init_distributed_environment(backend="gloo")` (which adopts the process group the rank already
has), `initialize_model_parallel(tp, 1, decode_context_model_parallel_size=dcp)`, then
`initialize_model`. Kimi-K3's MTP draft is built the way vLLM's proposer builds it: a second
`initialize_model` under the same `VllmConfig`, so its attention registers in the same
compilation config's static forward context while its modules form a separate tree.
DeepSeek-V3 (vLLM's generic `MLAAttention`) is built without a draft.

vLLM's parallel state is process-global, so a rank builds one configuration and reuses it
(`build_real` caches by spec); asking for a second geometry in one process is a UsageError.
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from harness.core import preloaded
from harness.core.peers import VLLM_REQUIREMENT
from harness.core.signature import COMM_BACKENDS
from harness.errors import UsageError
from harness.models.real.configs import MAX_MODEL_LEN, REAL_MODEL_CHOICES, TINY_CONFIGS
from harness.models.real.shims import SHIMS, Shim, applied
from harness.schema.base import Limitation
from harness.schema.plan import RankPlan
from harness.schema.rank_record import RealTreeRecord

KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8")


@dataclass(frozen=True)
class RealSpec:
    """One real-tree configuration: model, geometry, KV cache dtype, DCP comm backend."""

    model: str
    tp: int
    dcp: int
    kv_cache_dtype: str = "auto"
    dcp_comm_backend: str = "ag_rs"
    max_tokens: int = 8  # max_num_batched_tokens (and max_num_seqs) of the tiny scheduler
    # The draft's own KV cache dtype (vLLM's speculative_config.kv_cache_dtype); None: the
    # target's, as in vLLM.
    draft_kv_cache_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.model not in REAL_MODEL_CHOICES:
            raise UsageError(
                f"no real tree for {self.model!r}; expected one of {', '.join(REAL_MODEL_CHOICES)}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise UsageError(
                f"unknown kv cache dtype {self.kv_cache_dtype!r}; expected {KV_CACHE_DTYPES}"
            )
        if self.draft_kv_cache_dtype is not None:
            if self.draft_kv_cache_dtype not in KV_CACHE_DTYPES:
                raise UsageError(
                    f"unknown draft kv cache dtype {self.draft_kv_cache_dtype!r}; "
                    f"expected {KV_CACHE_DTYPES}"
                )
            if TINY_CONFIGS[self.model]().draft is None:
                raise UsageError(f"{self.model} is built without a draft; no draft kv dtype")
        if self.dcp_comm_backend not in COMM_BACKENDS:
            raise UsageError(
                f"unknown dcp comm backend {self.dcp_comm_backend!r}; expected {COMM_BACKENDS}"
            )
        if self.tp < 1 or self.dcp < 1 or self.tp % self.dcp:
            raise UsageError(f"dcp={self.dcp} must divide tp={self.tp}")


def planned_spec(plan: RankPlan, world_size: int) -> RealSpec:
    """The configuration a run's real suites build on a world of `world_size` ranks (vLLM
    builds tp = world size); one place, so what the bench builds beside a run is the run's."""
    return RealSpec(
        plan.real_model,
        tp=world_size,
        dcp=plan.resolved_dcp(world_size),
        kv_cache_dtype=plan.kv_cache_dtype,
        dcp_comm_backend=plan.dcp_comm_backend,
        draft_kv_cache_dtype=plan.draft_kv_cache_dtype or None,
    )


@dataclass
class RealTree:
    """A built real tree: target, draft, and what production warmup also sees."""

    spec: RealSpec
    target: nn.Module
    draft: nn.Module | None
    vllm_config: Any
    static_forward_context: dict[str, nn.Module]
    dcp_group: Any  # torch ProcessGroup of this rank's DCP group (vLLM's own, gloo on CPU)
    shims: tuple[Shim, ...]
    build_s: float  # construction only (config, parallel state, both trees)
    # Importing what this process had not imported of vLLM (`import vllm` included): the
    # larger share of a cold first build, about nothing where the forkserver preloaded vLLM.
    import_s: float = 0.0
    draft_layers: tuple[str, ...] = field(default=())

    @property
    def attention_classes(self) -> tuple[str, ...]:
        """Qualified class names of every attention layer in the static forward context."""
        return tuple(
            sorted({f"{type(m).__module__}.{type(m).__qualname__}" for m in self.layers().values()})
        )

    def layers(self) -> dict[str, nn.Module]:
        return dict(self.static_forward_context)

    def record(self) -> RealTreeRecord:
        """The rank record's view: which classes were real, which shims, the build cost."""
        return RealTreeRecord(
            model=self.spec.model,
            tp=self.spec.tp,
            dcp=self.spec.dcp,
            kv_cache_dtype=self.spec.kv_cache_dtype,
            dcp_comm_backend=self.spec.dcp_comm_backend,
            draft_kv_cache_dtype=self.spec.draft_kv_cache_dtype,
            classes=self.attention_classes,
            draft_layers=self.draft_layers,
            shims=tuple(s.name for s in self.shims),
            limitations=tuple(Limitation.parse(line) for line in self.limitations()),
            build_s=round(self.build_s, 3),
            import_s=round(self.import_s, 3),
            # This process's peak RSS so far (the rank plugin re-reads it after every test).
            peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        )

    def limitations(self) -> tuple[str, ...]:
        """What the receipt must say about this tree: real classes, shims, what was left out."""
        draft = f"draft {type(self.draft).__name__}" if self.draft is not None else "no draft"
        if self.draft is not None and self.spec.draft_kv_cache_dtype is not None:
            draft += f" at kv_cache_dtype={self.spec.draft_kv_cache_dtype}"
        lines = [
            f"real-trees: {self.spec.model} built from vLLM's own classes "
            f"({', '.join(self.attention_classes)}; {draft}) at tp={self.spec.tp} "
            f"dcp={self.spec.dcp} kv_cache_dtype={self.spec.kv_cache_dtype} "
            f"dcp_comm_backend={self.spec.dcp_comm_backend}; tiny config (no KDA, no MoE, "
            "random weights)",
            *(f"real-tree shim {s.describe()}" for s in self.shims),
            NOT_BUILT,
        ]
        return tuple(lines)


# What vLLM 0.32 upstream cannot give a real tree for, said in every real run's limitations.
NOT_BUILT = (
    "real-trees not built: DeepSeek-V4 (vLLM 0.32's DeepseekV4Attention has no DCP path: no "
    "dcp/decode_context in vllm/models/deepseek_v4/, no V4_B12X_SPARSE backend, no "
    "DeepseekV4B12xMLAAttention; that layer is the fork's and runs as a stand-in only); a draft "
    "at another DCP (the draft shares the target's process-global DCP group; DCP is not a "
    "draft override in vLLM 0.32); a mixed tree (one architecture per engine)"
)

_BUILT: dict[RealSpec, RealTree] = {}


def _vllm_class(path: str) -> type:
    """`package.module:Class` imported (the draft classes live in vLLM's model packages)."""
    import importlib

    module, _, name = path.partition(":")
    found = getattr(importlib.import_module(module), name)
    if not isinstance(found, type):
        raise TypeError(f"{path} is a {type(found).__name__}, not a class")
    return found


def _module_names(module: nn.Module) -> set[int]:
    return {id(m) for m in module.modules()}


def make_vllm_config(spec: RealSpec, folder: Path) -> Any:
    """vLLM's own config for `spec` over the tiny config.json in `folder` (no process group
    needed). The mamba block size is pinned to the model length: vLLM's hybrid-model check
    otherwise refuses the Kimi config without prefix caching."""
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig

    config = VllmConfig(
        parallel_config=ParallelConfig(
            tensor_parallel_size=spec.tp,
            decode_context_parallel_size=spec.dcp,
            dcp_comm_backend=spec.dcp_comm_backend,
        ),
        cache_config=CacheConfig(
            cache_dtype=spec.kv_cache_dtype,
            enable_prefix_caching=False,
            mamba_block_size=MAX_MODEL_LEN,
        ),
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=spec.max_tokens,
            max_num_seqs=spec.max_tokens,
            max_model_len=MAX_MODEL_LEN,
            is_encoder_decoder=False,
        ),
        model_config=ModelConfig(
            model=str(folder),
            skip_tokenizer_init=True,
            dtype="bfloat16",
            enforce_eager=True,
            max_model_len=MAX_MODEL_LEN,
        ),
    )
    keep_token_budget(config, spec.max_tokens)
    return config


def keep_token_budget(config: Any, max_tokens: int) -> None:
    """Hold the scheduler's token budget at the spec's, whatever CPU builds the tree.

    vLLM's CPU platform raises `max_num_batched_tokens` to at least 2048 for an MLA model when
    the CPU has no AMX tiles (its reference MLA kernels cannot chunk a prefill); with AMX it
    leaves the budget alone. The transports' keys carry that budget, so without this a tree
    built on an AMD or older Intel host would be warmed at another capacity than on a newer
    Intel host, and the same checkout would pass on one and fail on the other."""
    config.scheduler_config.max_num_batched_tokens = max_tokens


def draft_vllm_config(vllm_config: Any, kv_cache_dtype: str | None) -> Any:
    """The draft's config as vLLM's proposer makes it: `SpeculativeConfig.apply_draft_overrides`
    (its own code, called with only the overrides set) over the target's config, so the draft
    keeps the target's compilation config (one static forward context) and parallel state."""
    from types import SimpleNamespace

    from vllm.config import SpeculativeConfig

    overrides = SimpleNamespace(
        moe_backend=None, attention_backend=None, kv_cache_dtype=kv_cache_dtype
    )
    # Read before: the draft's config is a shallow copy whose validation runs the CPU
    # platform's check again, on the scheduler config both share.
    budget = vllm_config.scheduler_config.max_num_batched_tokens
    draft = SpeculativeConfig.apply_draft_overrides(overrides, vllm_config)
    keep_token_budget(draft, budget)
    return draft


def _build(spec: RealSpec, folder: Path, skip: frozenset[str], imported: float) -> RealTree:
    """Build `spec`'s trees; `imported`: when importing vLLM began (monotonic)."""
    import torch.distributed as dist
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import get_dcp_group
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    if not dist.is_initialized():
        raise UsageError("real trees are built inside a run's process group; none is set up")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != spec.tp:
        raise UsageError(
            f"vLLM builds tp={spec.tp} only on a world of {spec.tp} ranks, this one has {world}"
        )
    config = TINY_CONFIGS[spec.model]()
    config.write(folder)
    started = time.monotonic()
    import_s = started - imported
    with ExitStack() as stack:
        shims = stack.enter_context(applied(SHIMS, model=spec.model, skip=skip))
        vllm_config = make_vllm_config(spec, folder)
        with set_current_vllm_config(vllm_config):
            init_distributed_environment(
                world_size=world, rank=rank, local_rank=rank % max(world, 1), backend="gloo"
            )
            initialize_model_parallel(spec.tp, 1, decode_context_model_parallel_size=spec.dcp)
            with set_default_torch_dtype(vllm_config.model_config.dtype):
                target = initialize_model(vllm_config=vllm_config)
                draft = None
                if config.draft is not None:
                    draft_config = draft_vllm_config(vllm_config, spec.draft_kv_cache_dtype)
                    with set_current_vllm_config(draft_config):
                        draft = initialize_model(
                            vllm_config=draft_config, model_class=_vllm_class(config.draft)
                        )
        context = dict(vllm_config.compilation_config.static_forward_context)
        in_draft = _module_names(draft) if draft is not None else set()
        return RealTree(
            spec=spec,
            target=target,
            draft=draft,
            vllm_config=vllm_config,
            static_forward_context=context,
            dcp_group=get_dcp_group().cpu_group,
            shims=tuple(shims),
            build_s=time.monotonic() - started,
            import_s=import_s,
            draft_layers=tuple(name for name, m in context.items() if id(m) in in_draft),
        )


def build_real(spec: RealSpec, *, skip_shims: frozenset[str] = frozenset()) -> RealTree:
    """The real tree for `spec` on this rank, built on first use and reused after."""
    if spec in _BUILT:
        return _BUILT[spec]
    if _BUILT:
        other = next(iter(_BUILT))
        raise UsageError(
            f"this rank already built real trees for {other}; vLLM's parallel state is "
            f"process-global, so {spec} needs its own run"
        )
    imported = time.monotonic()
    preloaded.reissue(preloaded.REAL_TREES)  # a forked rank: what its import would warn
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"real trees need {VLLM_REQUIREMENT}: {exc}") from None
    folder = Path(tempfile.mkdtemp(prefix=f"dcpqual-real-{spec.model}-"))
    try:
        tree = _build(spec, folder, skip_shims, imported)
    finally:  # vLLM reads config.json while building; nothing of the run stays in /tmp
        shutil.rmtree(folder, ignore_errors=True)
    _BUILT[spec] = tree
    return tree


def built_trees() -> tuple[RealTree, ...]:
    """Every real tree this process built (for the rank record)."""
    return tuple(_BUILT.values())
