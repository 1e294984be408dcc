"""The source lock (`images/<image>/source.lock.json`, schema "dcpqual-source-lock/v2").

The shape only: placeholders are allowed here, so `dcpqual lock pin` can fill a template;
`harness.image.lock.check_lock` decides whether a lock actually pins something.

v2 over v1: the foundation the image builds on is a choice (`foundation.kind`); every version the
image is for is data (`versions`, never a constant in code); the Python pins the fork and b12x
disagree on are decided here with the reason (`python_pins`); where b12x comes from is said
(`b12x_from`); the build's parallelism caps and the fork's requirement files are data too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from harness.schema.base import Model

LOCK_SCHEMA = "dcpqual-source-lock/v2"


class GitSource(Model):
    repository: str
    ref: str
    commit: str  # the commit built: the base with every pull request below merged, if any
    tree: str  # that commit's tree; the build refuses any other


class UpstreamBase(Model):
    repository: str
    ref: str
    commit: str


class PullRequest(Model):
    """A pull request of the component's repository that `source.commit` contains: its head is
    an ancestor of `source.commit` (checked by `lock pin` and again by the build)."""

    number: int = Field(ge=1)
    head: str
    merge_commit: str | None
    title: str


class Component(Model):
    source: GitSource
    upstream_base: UpstreamBase | None
    pull_requests: tuple[PullRequest, ...]
    source_patches: tuple[str, ...]  # patch files; a lock that pins must have none


class BaseImage(Model):
    reference: str  # repository:tag, without the digest
    digest: str  # sha256:<64 hex>

    @property
    def pinned(self) -> str:
        """The reference a FROM line uses: the tag for people, the digest for the machine."""
        return f"{self.reference}@{self.digest}"


class Foundation(Model):
    """What the image builds on.

    `source`: `image` is a CUDA devel image; NCCL and PyTorch are built from the lock's `nccl`
    and `pytorch` components (Dockerfile.foundation, hours). `image`: `image` already carries
    CUDA, torch, Triton and NCCL; the lock names no `nccl`/`pytorch` component and `labels` are
    the labels (key -> value) the image must carry, checked on the engine before the build.
    Either way the build checks the versions from inside (nvcc, torch, NCCL, Triton).
    """

    kind: Literal["source", "image"]
    image: BaseImage
    labels: dict[str, str]


class Versions(Model):
    """What the image is for; every check and build argument reads these, none is a constant."""

    cuda: str  # MAJOR.MINOR, as nvcc and torch.version.cuda say it
    torch: str
    nccl: str
    triton: str
    torch_cuda_arch_list: str  # "12.0a": sm_120 (RTX PRO 6000 Blackwell)


class PythonPin(Model):
    """A distribution the image installs at exactly `version`, decided here rather than left to
    pip's resolver, and why (a pin two requirements disagree on is decided by the lock)."""

    name: str  # distribution, with extras: "nvidia-cutlass-dsl[cu13]"
    version: str
    why: str


class B12xFrom(Model):
    """Where b12x comes from: its own repository (`components.b12x`, installed without its
    dependencies), or the `b12x` package bundled in a named flashinfer-python build."""

    kind: Literal["repository", "flashinfer-python"]
    flashinfer_version: str | None  # for flashinfer-python: the exact version installed
    index_url: str | None  # for flashinfer-python: where that version is published


class VllmBuild(Model):
    """How the fork is built: its own requirement files (paths in its tree) and its optional
    Rust frontend (setuptools-rust; `VLLM_REQUIRE_RUST_FRONTEND=1` makes a missing one fail)."""

    build_requirements: str
    runtime_requirements: str
    rust_frontend: bool
    rust_toolchain: str  # rustup toolchain, e.g. "1.92.0"


class BuildCaps(Model):
    """Parallelism of the compile steps: nvcc on 16+ cores without a cap runs out of memory."""

    max_jobs: int = Field(ge=1)
    nvcc_threads: int = Field(ge=1)


class SourceGate(Model):
    """Focused tests of a component's own tree that must pass in the image: `cpu` gates run in
    the build (everywhere), `gpu` gates on the GPU node. A failure fails the build or the run."""

    component: str  # a key of `components`
    where: Literal["cpu", "gpu"]
    tests: tuple[str, ...] = Field(min_length=1)  # pytest node ids, relative to its tree


class SourceLock(Model):
    schema_: Literal["dcpqual-source-lock/v2"] = Field(alias="schema")
    image: str
    foundation: Foundation
    versions: Versions
    build: BuildCaps
    vllm_build: VllmBuild
    b12x_from: B12xFrom
    python_pins: tuple[PythonPin, ...]
    source_gates: tuple[SourceGate, ...]
    components: dict[str, Component]
