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


@dataclass(frozen=True)
class Shim:
    """One stand-in for something the platform lacks, applied around model construction."""

    name: str
    reason: str
    needed: Callable[[], bool]
    patch: Callable[[], AbstractContextManager[None]]

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


def b12x_named(backend: type) -> type:
    """A subclass of the backend the platform selected whose `get_name()` is the B12X dense-MLA
    name; the impl, metadata and kernels stay the selected backend's own."""

    def get_name() -> str:
        return B12X_DENSE_MLA

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


def _b12x_backend_missing() -> bool:
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except ImportError:
        return True
    return B12X_DENSE_MLA not in AttentionBackendEnum.__members__ or _cuda_missing()


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
def applied(shims: tuple[Shim, ...], *, skip: frozenset[str] = frozenset()) -> Iterator[list[Shim]]:
    """Apply every needed shim not in `skip`; yields the ones applied, in order."""
    used: list[Shim] = []
    patches: list[AbstractContextManager[None]] = []
    try:
        for shim in shims:
            if shim.name in skip or not shim.needed():
                continue
            patch = shim.patch()
            patch.__enter__()
            patches.append(patch)
            used.append(shim)
        yield used
    finally:
        for patch in reversed(patches):
            patch.__exit__(None, None, None)
