"""The source lock (`images/<image>/source.lock.json`, schema "dcpqual-source-lock/v1").

The shape only: placeholders are allowed here, so `dcpqual lock pin` can fill a template;
`harness.image.lock.check_lock` decides whether a lock actually pins something.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from harness.schema.base import Model

LOCK_SCHEMA = "dcpqual-source-lock/v1"


class GitSource(Model):
    repository: str
    ref: str
    commit: str
    tree: str


class UpstreamBase(Model):
    repository: str
    ref: str
    commit: str


class PullRequest(Model):
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


class Versions(Model):
    cuda: str
    torch: str
    nccl: str


class SourceLock(Model):
    schema_: Literal["dcpqual-source-lock/v1"] = Field(alias="schema")
    image: str
    base_image: BaseImage
    versions: Versions
    torch_cuda_arch_list: str
    components: dict[str, Component]
