"""The image a run used: the build's identity (`identity.json`, schema
"dcpqual-image-identity/v1", written by `dcpqual image build`) and the receipt's `image`.

`ImageIdentity` is the receipt's `Image` with every field the build always writes required and
its schema id fixed: what `dcpqual image build --out` writes, what `dcpqual gpu16` reads and
hands to the container (`DCPQUAL_IMAGE_IDENTITY`), and, with the in-image check of the run added
as `runtime`, what the receipt carries. The receipt's `Image` stays lenient (every field
optional) so a receipt without an image identity, or from an older build, still reads.
"""

from __future__ import annotations

from typing import Any, Final, Literal, Self

from pydantic import ConfigDict, Field, ValidationError

from harness.errors import UsageError
from harness.schema.base import Model, first_error

# The environment variable a `dcpqual gpu16` container names its image's identity in (JSON);
# the ranks inherit it.
IDENTITY_ENV = "DCPQUAL_IMAGE_IDENTITY"

IDENTITY_SCHEMA: Final = "dcpqual-image-identity/v1"
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"


class GitPin(Model):
    """A component's source as the image records it: the lock's pin at build time, or what
    fetch-source.sh wrote inside the image (name, repository, commit, tree)."""

    name: str | None = None
    repository: str | None = None
    ref: str | None = None
    commit: str | None = None
    tree: str | None = None


class ImageHarness(Model):
    """The harness tree the image was built from; `dirty` None: not known."""

    commit: str | None = None
    tree: str | None = None
    dirty: bool | None = None


class GateTally(Model):
    """One source gate as it ran in the image (`python -m harness.image.gates`): the component's
    own focused tests, where they ran, and pytest's tallies. `ran` False: it could not run (its
    tests are not in the image, pytest did not start); a gate that ran no test did not pass."""

    component: str
    where: Literal["cpu", "gpu"]
    tests: list[str]
    ran: bool
    exit_code: int | None = None
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    note: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.ran
            and self.exit_code == 0
            and self.failed == 0
            and self.errors == 0
            and self.passed > 0
        )

    @property
    def key(self) -> str:
        return f"{self.component}/{self.where}"


class ExpectedRuntime(Model):
    """What a correct image holds, from its source lock."""

    torch: str | None = None
    torch_commit: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    arch: str | None = None
    sources: dict[str, GitPin] = Field(default_factory=dict)
    source_gates: list[str] = Field(default_factory=list)  # "component/where", from the lock


class ObservedRuntime(Model):
    """What the in-image check found inside the running container."""

    torch: str | None = None
    torch_commit: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    arch: list[str] = Field(default_factory=list)
    cuda_available: bool = False
    devices: list[str] = Field(default_factory=list)
    packages: dict[str, str | None] = Field(default_factory=dict)
    sources: dict[str, GitPin] = Field(default_factory=dict)
    image_lock_sha256: str | None = None
    harness: ImageHarness | None = None
    source_gates: list[GateTally] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class ImageRuntime(Model):
    """The in-image identity check (`python -m harness.image.verify_runtime`), run again inside
    the container the suites ran in."""

    schema_: str = Field(default="dcpqual-image-runtime/v1", alias="schema")
    ok: bool
    lock_path: str = ""
    lock_sha256: str | None = None
    image_lock_sha256: str | None = None
    expected: ExpectedRuntime = Field(default_factory=ExpectedRuntime)
    observed: ObservedRuntime = Field(default_factory=ObservedRuntime)
    mismatches: list[str] = Field(default_factory=list)


class Image(Model):
    """Identity of the image the run used (schema "dcpqual-image-identity/v1", written by
    `dcpqual image build`), with the in-image check of this run in `runtime`."""

    reference: str | None = None
    digest: str | None = Field(default=None, pattern=DIGEST_PATTERN)
    source_lock_sha256: str | None = None
    # the build's identity (harness.image.identity)
    schema_: str | None = Field(default=None, alias="schema")
    image_id: str | None = None
    repo_digests: list[str] = Field(default_factory=list)
    image: str | None = None
    lock_path: str | None = None
    base_image: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    torch_cuda_arch_list: str | None = None
    sources: dict[str, GitPin] = Field(default_factory=dict)
    harness: ImageHarness | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    built_at: str | None = None
    runtime: ImageRuntime | None = None

    def qualification_blockers(self) -> list[str]:
        """Why this identity cannot back a `qualified` receipt; [] when it can."""
        blockers = []
        if not (self.digest or "").startswith("sha256:"):
            blockers.append("image digest is missing")
        if self.harness is None or self.harness.dirty is not False:
            blockers.append("image was built from a dirty harness tree")
        if self.runtime is None:
            blockers.append("the in-image identity check did not run")
        else:
            if not self.runtime.ok:
                first = (self.runtime.mismatches or ["(no detail)"])[0]
                blockers.append(f"the in-image identity check failed: {first}")
            if self.runtime.lock_sha256 != self.source_lock_sha256:
                blockers.append("the in-image check used a different lock than the build")
            ran = {g.key for g in self.runtime.observed.source_gates if g.ok}
            for key in self.runtime.expected.source_gates:
                if key not in ran:
                    blockers.append(f"source gate {key} did not run and pass")
        return blockers


class ImageIdentity(Image):
    """What `dcpqual image build` wrote about the image it built (see the module doc)."""

    # Every key is written, so the schema of the file requires every key.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    schema_: Literal["dcpqual-image-identity/v1"] = Field(default=IDENTITY_SCHEMA, alias="schema")
    reference: str  # the tag the build gave the image (for people; it can move)
    image_id: str  # the engine's content address of the image config, sha256:<64 hex>
    # The identity a run is pinned to: the registry digest of the manifest when the image was
    # pushed, else `image_id`; runs start containers from it, never from the tag.
    digest: str = Field(pattern=DIGEST_PATTERN)
    repo_digests: list[str]  # ["repo@sha256:..."], empty for an image never pushed
    image: str  # the image's name in the lock
    lock_path: str
    source_lock_sha256: str  # sha256 of the lock's bytes, also the label io.dcpqual.lock.sha256
    base_image: str  # the base reference with its digest (repo:tag@sha256:...)
    versions: dict[str, str]  # cuda, torch, nccl as locked
    torch_cuda_arch_list: str
    sources: dict[str, GitPin]  # as locked
    harness: ImageHarness  # the harness tree the image was built from
    labels: dict[str, str]  # as the engine reports them (checked against the lock at build)
    built_at: str  # UTC ISO-8601 time the build finished

    def check_failure(self) -> str | None:
        """What the in-image check holds against the image (its first mismatch, or that it did
        not run); None when it passed."""
        if self.runtime is None:
            return "the check did not run"
        if self.runtime.ok:
            return None
        return (self.runtime.mismatches or ["the check reported no mismatch"])[0]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def from_json(cls, data: object) -> Self:
        """The identity `data` describes; anything else is one UsageError line."""
        if not isinstance(data, dict) or data.get("schema") != IDENTITY_SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise UsageError(f"not an image identity (schema {found!r}, want {IDENTITY_SCHEMA})")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise UsageError(f"image identity: {first_error(exc)}") from None
