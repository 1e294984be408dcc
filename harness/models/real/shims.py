"""Named shims that let vLLM 0.32's real model classes be built on a CPU rank.

Each shim is one small piece with a name, a reason (which goes into the receipt's
`limitations`) and a test that fails when it is removed. A shim is applied only where the
platform lacks the thing it stands in for: on a CUDA build with the B12X fork none applies.
Shims are context managers around construction only; only the `dist-ident` environment
variable outlives it (vLLM's communicator keeps reading it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

B12X_DENSE_MLA = "B12X_MLA"
B12X_SPARSE_MLA = "B12X_MLA_SPARSE"
# The fork's generic-MLA B12X gate: backend B12X_MLA_SPARSE, comm backend a2a, DCP in 2/4/8.
GENERIC_B12X_DCP_SIZES = (2, 4, 8)
EVERY_MODEL = frozenset({"kimi-k3", "deepseek-v3"})


@dataclass(frozen=True)
class Shim:
    """One stand-in for something the platform lacks, applied around model construction."""

    name: str
    reason: str
    needed: Callable[[], bool]
    patch: Callable[[], AbstractContextManager[None]]
    models: frozenset[str] = EVERY_MODEL  # the real trees whose construction needs it

    def describe(self) -> str:
        return f"{self.name}: {self.reason}"


class HostStream:
    """Stands in for `torch.cuda.Stream`/`torch.cuda.Event` at construction: the real
    constructors only store these objects for overlap on a GPU; CPU torch cannot make them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args


@contextmanager
def _cuda_stream_objects() -> Iterator[None]:
    with (
        mock.patch.object(torch.cuda, "Stream", HostStream),
        mock.patch.object(torch.cuda, "Event", HostStream),
    ):
        yield


def _cuda_missing() -> bool:
    return not torch.cuda.is_available()


def b12x_named(backend: type, name: str = B12X_DENSE_MLA) -> type:
    """A subclass of the backend the platform selected whose `get_name()` is the B12X name
    `name`; the impl, metadata and kernels stay the selected backend's own."""

    def get_name() -> str:
        return name

    return type(
        "B12XNamedBackend",
        (backend,),
        {
            "get_name": staticmethod(get_name),
            "selected_backend": backend,
            "__qualname__": f"B12XNamed[{backend.__qualname__}]",
        },
    )


@contextmanager
def _b12x_backend_name() -> Iterator[None]:
    from vllm.models.kimi_k3.nvidia import mla

    selected = mla.get_attn_backend

    def select(*args: Any, **kwargs: Any) -> type:
        backend = selected(*args, **kwargs)
        return backend if backend.get_name() == B12X_DENSE_MLA else b12x_named(backend)

    mla.get_attn_backend = select
    try:
        yield
    finally:
        mla.get_attn_backend = selected


def _backend_missing(name: str) -> bool:
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except ImportError:
        return True
    return name not in AttentionBackendEnum.__members__ or _cuda_missing()


def _b12x_backend_missing() -> bool:
    return _backend_missing(B12X_DENSE_MLA)


def _b12x_sparse_missing() -> bool:
    return _backend_missing(B12X_SPARSE_MLA)


@contextmanager
def _b12x_sparse_backend_name() -> Iterator[None]:
    from vllm.model_executor.layers.attention import mla_attention

    selected = mla_attention.get_attn_backend

    def select(*args: Any, **kwargs: Any) -> type:
        backend = selected(*args, **kwargs)
        renamed = backend.get_name() != B12X_SPARSE_MLA
        return b12x_named(backend, B12X_SPARSE_MLA) if renamed else backend

    mla_attention.get_attn_backend = select
    try:
        yield
    finally:
        mla_attention.get_attn_backend = selected


def fork_dcp_b12x(backend_name: str, comm_backend: str, dcp: int) -> bool:
    """The fork's `MLAAttention.dcp_b12x`: B12X DCP transport for generic MLA layers."""
    return (
        backend_name == B12X_SPARSE_MLA and comm_backend == "a2a" and dcp in GENERIC_B12X_DCP_SIZES
    )


@contextmanager
def _b12x_dcp_gate() -> Iterator[None]:
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    original = MLAAttention.__init__

    def gated_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        parallel = get_current_vllm_config().parallel_config
        self.dcp_b12x = fork_dcp_b12x(
            self.attn_backend.get_name(),
            parallel.dcp_comm_backend,
            int(self.impl.dcp_world_size),
        )

    MLAAttention.__init__ = gated_init
    try:
        yield
    finally:
        MLAAttention.__init__ = original


def _dcp_gate_missing() -> bool:
    """Upstream `MLAAttention` has no B12X gate; the fork's sets `dcp_b12x` at construction."""
    import inspect

    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    return "dcp_b12x" not in inspect.getsource(MLAAttention.__init__)


@contextmanager
def _cpu_mla_dcp_world_size() -> Iterator[None]:
    from vllm.config import get_current_vllm_config
    from vllm.v1.attention.backends.mla.cpu_mla import CPUMLAImpl

    original = CPUMLAImpl.__init__

    def sized_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        # What MLACommonImpl.__init__ (which CPUMLAImpl skips) sets.
        self.dcp_world_size = get_current_vllm_config().parallel_config.decode_context_parallel_size

    CPUMLAImpl.__init__ = sized_init
    try:
        yield
    finally:
        CPUMLAImpl.__init__ = original


def _cpu_mla_pins_dcp() -> bool:
    """vLLM 0.32's CPU MLA impl skips `MLACommonImpl.__init__` and pins `dcp_world_size = 1`,
    so generic MLA layers build no DCP manager; AMX_MLA (chosen where the CPU has AMX tiles)
    and the CUDA impls read the config."""
    try:
        import inspect

        from vllm.v1.attention.backends.mla.cpu_mla import CPUMLAImpl
    except ImportError:
        return False
    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    return not amx and "self.dcp_world_size = 1" in inspect.getsource(CPUMLAImpl.__init__)


@contextmanager
def _dist_ident() -> Iterator[None]:
    # One identity per rank: the ranks then do not share an SHM group name, so vLLM keeps its
    # CPU shared-memory communicator off and its groups use torch.distributed (gloo). Kept
    # after construction: vLLM's communicators read it for the life of the process.
    os.environ["VLLM_DIST_IDENT"] = f"dcpqual-rank-{os.getpid()}"
    yield


SHIMS: tuple[Shim, ...] = (
    Shim(
        "cuda-stream-objects",
        "torch.cuda.Stream()/torch.cuda.Event() made at construction (Kimi-K3 model, MTP and "
        "MLA overlap) were host objects; CPU torch has no CUDA streams",
        _cuda_missing,
        _cuda_stream_objects,
    ),
    Shim(
        "b12x-backend-name",
        "the CPU platform selects CPU_MLA/AMX_MLA for MLA; Kimi-K3's selector was wrapped to "
        "return a subclass of the selected backend named B12X_MLA (impl and kernels stay the "
        "platform's)",
        _b12x_backend_missing,
        _b12x_backend_name,
        frozenset({"kimi-k3"}),
    ),
    Shim(
        "cpu-mla-dcp-world-size",
        "vLLM 0.32's CPU_MLA impl pins impl.dcp_world_size = 1 (it skips MLACommonImpl's "
        "constructor); it was set to parallel_config.decode_context_parallel_size as "
        "MLACommonImpl (AMX_MLA, CUDA backends) sets it, so MLAAttention builds its DCP manager",
        _cpu_mla_pins_dcp,
        _cpu_mla_dcp_world_size,
        frozenset({"deepseek-v3"}),
    ),
    Shim(
        "b12x-sparse-backend-name",
        "the CPU platform selects CPU_MLA/AMX_MLA for MLA; MLAAttention's selector was wrapped "
        "to return a subclass of the selected backend named B12X_MLA_SPARSE (impl and kernels "
        "stay the platform's)",
        _b12x_sparse_missing,
        _b12x_sparse_backend_name,
        frozenset({"deepseek-v3"}),
    ),
    Shim(
        "b12x-dcp-gate",
        "upstream MLAAttention has no B12X gate; dcp_b12x was set after construction as the "
        "fork computes it (backend B12X_MLA_SPARSE, dcp_comm_backend a2a, DCP in 2/4/8)",
        _dcp_gate_missing,
        _b12x_dcp_gate,
        frozenset({"deepseek-v3"}),
    ),
    Shim(
        "dist-ident",
        "VLLM_DIST_IDENT set per rank (vLLM's CPU worker sets it per instance): the CPU "
        "shared-memory communicator stays off and vLLM's groups use torch.distributed (gloo); "
        "with one shared identity its SHM segments aborted a 16-rank build here",
        lambda: "VLLM_DIST_IDENT" not in os.environ,
        _dist_ident,
    ),
)


def shim_named(name: str) -> Shim:
    return next(s for s in SHIMS if s.name == name)


@contextmanager
def applied(
    shims: tuple[Shim, ...], *, model: str, skip: frozenset[str] = frozenset()
) -> Iterator[list[Shim]]:
    """Apply every shim `model` needs, not in `skip`; yields the ones applied, in order."""
    used: list[Shim] = []
    patches: list[AbstractContextManager[None]] = []
    try:
        for shim in shims:
            if model not in shim.models or shim.name in skip or not shim.needed():
                continue
            patch = shim.patch()
            patch.__enter__()
            patches.append(patch)
            used.append(shim)
        yield used
    finally:
        for patch in reversed(patches):
            patch.__exit__(None, None, None)
