"""Image identity: what the receipt says about the image a run used.

`ImageIdentity.to_json()` is the dict the evidence writer embeds (`RunContext.image`). Keys:

- `schema`: "dcpqual-image-identity/v1"
- `reference`: the tag the build gave the image (for people; it can move)
- `image_id`: the engine's content address of the image config, `sha256:<64 hex>`
- `digest`: the identity a run is pinned to: the registry digest (`sha256:...` of the manifest)
  when the image was pushed, else `image_id`; runs start containers from it, never from the tag
- `repo_digests`: `["repo@sha256:..."]`, empty for an image never pushed
- `image`: the image's name in the lock (`kimi-k3-cu133-torch213`)
- `lock_path`, `source_lock_sha256`: the source lock, and the sha256 of its bytes (also the
  image label `io.dcpqual.lock.sha256`); the receipt schema's `image.source_lock_sha256`
- `base_image`: the base reference with its digest (`repo:tag@sha256:...`)
- `versions`: {`cuda`, `torch`, `nccl`} as locked; `torch_cuda_arch_list`: "12.0a"
- `sources`: {component: {`repository`, `ref`, `commit`, `tree`}} as locked
- `harness`: {`commit`, `tree`, `dirty`} of the harness tree the image was built from
- `labels`: the labels the engine reports on the image (checked against the lock at build time)
- `built_at`: UTC ISO-8601 time the build finished
- `runtime`: the in-image check (`harness.image.verify_runtime` report: `ok`, `mismatches`,
  `expected`, `observed`, ...), or null when it was not run

Inside a container started by `dcpqual gpu16`, the build identity arrives in the environment
variable `DCPQUAL_IMAGE_IDENTITY`; `image_for_run()` re-runs the in-image check there and returns
the dict for `RunContext.image` (None outside such a container). `qualification_blockers()` lists
why an identity cannot back a `qualified` receipt; an empty list means it can.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.jsonfile import JsonSyntaxError, read_json
from harness.schema.receipt import Image

IDENTITY_SCHEMA = "dcpqual-image-identity/v1"
IDENTITY_ENV = "DCPQUAL_IMAGE_IDENTITY"


@dataclass(frozen=True)
class ImageIdentity:
    reference: str
    image_id: str
    digest: str
    repo_digests: tuple[str, ...]
    image: str
    lock_path: str
    source_lock_sha256: str
    base_image: str
    versions: dict[str, str]
    torch_cuda_arch_list: str
    sources: dict[str, dict[str, str]]
    harness: dict[str, Any]
    labels: dict[str, str]
    built_at: str
    runtime: dict[str, Any] | None = None
    schema: str = field(default=IDENTITY_SCHEMA)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "reference": self.reference,
            "image_id": self.image_id,
            "digest": self.digest,
            "repo_digests": list(self.repo_digests),
            "image": self.image,
            "lock_path": self.lock_path,
            "source_lock_sha256": self.source_lock_sha256,
            "base_image": self.base_image,
            "versions": dict(self.versions),
            "torch_cuda_arch_list": self.torch_cuda_arch_list,
            "sources": {k: dict(v) for k, v in self.sources.items()},
            "harness": dict(self.harness),
            "labels": dict(self.labels),
            "built_at": self.built_at,
            "runtime": self.runtime,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ImageIdentity:
        if not isinstance(data, dict) or data.get("schema") != IDENTITY_SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise UsageError(f"not an image identity (schema {found!r}, want {IDENTITY_SCHEMA})")
        try:
            return cls(
                reference=data["reference"],
                image_id=data["image_id"],
                digest=data["digest"],
                repo_digests=tuple(data["repo_digests"]),
                image=data["image"],
                lock_path=data["lock_path"],
                source_lock_sha256=data["source_lock_sha256"],
                base_image=data["base_image"],
                versions=dict(data["versions"]),
                torch_cuda_arch_list=data["torch_cuda_arch_list"],
                sources={k: dict(v) for k, v in data["sources"].items()},
                harness=dict(data["harness"]),
                labels=dict(data["labels"]),
                built_at=data["built_at"],
                runtime=data.get("runtime"),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise UsageError(f"image identity is missing or mangles {exc}") from None


def read_identity(path: Path) -> ImageIdentity:
    """The identity `dcpqual image build --out` wrote; a missing file names the fix."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no image identity at {path}; build the image first (nox -s image)")
    try:
        data = read_json(path)
    except JsonSyntaxError as exc:
        raise UsageError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: an image identity is a JSON object, not {type(data).__name__}")
    return ImageIdentity.from_json(data)


def qualification_blockers(image: dict[str, Any] | None) -> list[str]:
    """Why this image identity cannot back a `qualified` receipt; [] when it can."""
    if image is None:
        return ["no image: the run did not use a source-locked image"]
    return Image.model_validate(image).qualification_blockers()


def image_for_run() -> Image | None:
    """`RunContext.image` for a run inside a `dcpqual gpu16` container, else None.

    The build identity comes from the environment; the in-image check runs again here, so the
    receipt carries what this container actually holds, not what the build claimed.
    """
    raw = os.environ.get(IDENTITY_ENV)
    if not raw:
        return None
    from harness.image import verify_runtime  # imports torch; only inside an image run

    identity = ImageIdentity.from_json(json.loads(raw))
    report = verify_runtime.verify(verify_runtime.default_lock_path())
    return Image.model_validate({**identity.to_json(), "runtime": report.to_json()})
