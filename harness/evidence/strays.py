"""What a run left in its out folder that a bundle cannot hold, set aside before the bundle.

The launcher refused a non-empty folder at the start, so anything here came from the run: a
test may leave a symlink, a FIFO or socket, a name `SHA256SUMS` cannot carry, or files named
like the bundle's own (`receipt.json`, `summary.md`, `SHA256SUMS`, `junit/merged.xml`). None of
that may stop the bundle from being written, and none of it may pass for evidence: links and
special files are removed (never followed or read), bundle-named files and unlistable names are
moved under `strays/`, and each is named as a `Stray` so the run fails saying what it found.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.evidence.files import SUMS_NAME, unsafe_name, walk
from harness.schema.receipt import Stray

STRAYS_DIR = "strays"
# Names the writer creates; a file a test wrote under one of them is not the writer's.
BUNDLE_NAMES = frozenset({"receipt.json", "summary.md", SUMS_NAME, "junit/merged.xml"})


def _kind(path: Path) -> str:
    if path.is_symlink():
        return "symlink"
    if path.is_fifo():
        return "fifo"
    if path.is_socket():
        return "socket"
    if path.is_block_device() or path.is_char_device():
        return "device"
    return "file"


def _safe(relpath: str) -> str:
    return relpath.replace("\\", "_").replace("\n", "_").replace("\r", "_")


def _free(target: Path) -> Path:
    while target.exists() or target.is_symlink():
        target = target.with_name(target.name + "~")
    return target


def set_aside(out_dir: Path) -> list[Stray]:
    """Remove links and special files, move bundle-named and unlistable files to strays/."""
    out_dir = Path(out_dir)
    found: list[Stray] = []
    for entry in walk(out_dir):
        shown = _safe(entry.relpath)
        if entry.kind != "file":
            kind = _kind(entry.path)
            os.unlink(entry.path)  # a link is removed itself, never what it points to
            found.append(Stray(path=shown, kind=kind, action="removed"))
            continue
        if entry.relpath in BUNDLE_NAMES or unsafe_name(entry.relpath):
            target = _free(out_dir / STRAYS_DIR / shown)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(entry.path, target)
            found.append(
                Stray(path=shown, kind="file", action=f"moved to {target.relative_to(out_dir)}")
            )
    return found
