"""Image identity: the build's `identity.json` and what the receipt says about the image a run
used.

The format is `harness.schema.image.ImageIdentity` (schema "dcpqual-image-identity/v1"; its
fields are described there and in `schemas/image-identity.json`): `dcpqual image build --out`
writes it, `read_identity` reads it back, and it is the receipt's `Image` itself, so the writer
embeds it without a conversion.

Inside a container started by `dcpqual gpu16`, the build identity arrives in the environment
variable `DCPQUAL_IMAGE_IDENTITY`; `image_for_run()` re-runs the in-image check there and returns
the identity with that check as its `runtime` (None outside such a container).
`Image.qualification_blockers()` lists why an identity cannot back a `qualified` receipt; an
empty list means it can.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from harness.errors import UsageError
from harness.jsonfile import JsonSyntaxError, loads_strict, read_json
from harness.schema.image import IDENTITY_ENV, IDENTITY_SCHEMA, Image, ImageIdentity

__all__ = [
    "IDENTITY_ENV",
    "IDENTITY_SCHEMA",
    "ImageIdentity",
    "image_for_run",
    "read_identity",
]


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


def identity_from_environ(environ: Mapping[str, str] | None = None) -> ImageIdentity | None:
    """The build identity `dcpqual gpu16` hands its container, or None where none is set;
    anything malformed is one UsageError line. Checked before a launch: noticed only when the
    receipt is written, it would throw away a whole run."""
    raw = (os.environ if environ is None else environ).get(IDENTITY_ENV)
    if not raw:
        return None
    try:
        data = loads_strict(raw, where=f"${IDENTITY_ENV}")
    except JsonSyntaxError as exc:
        raise UsageError(f"${IDENTITY_ENV} is not strict JSON: {exc}") from None
    try:
        return ImageIdentity.from_json(data)
    except UsageError as exc:
        raise UsageError(f"${IDENTITY_ENV}: {exc}") from None


def image_for_run() -> Image | None:
    """`RunContext.image` for a run inside a `dcpqual gpu16` container, else None.

    The build identity comes from the environment; the in-image check runs again here, so the
    receipt carries what this container actually holds, not what the build claimed.
    """
    identity = identity_from_environ()
    if identity is None:
        return None
    from harness.image import verify_runtime  # imports torch; only inside an image run

    runtime = verify_runtime.verify(verify_runtime.default_lock_path())
    return identity.model_copy(update={"runtime": runtime})
