"""What a run left in its out folder that a bundle cannot hold, set aside before the bundle.

The launcher refused a non-empty folder at the start, so anything here came from the run: a
test may leave a symlink, a FIFO or socket, a name `SHA256SUMS` cannot carry, files named like
the bundle's own (`receipt.json`, `summary.md`, `SHA256SUMS`, `junit/merged.xml`,
`launch.json`), folders or files where the writer needs those names, anything at or under
`strays/` itself, or a folder its owner cannot list. None of that may stop the bundle from
being written, and none of it may pass for evidence: links and special files are removed (never
followed or read), folders in the writer's way are emptied and removed, the files are moved
under the bundle's own `strays/`, a locked folder is given back to its owner (u+rwx) and
removed where that fails, and each of these is named as a `Stray` so the run fails saying what
it found. `strays_problems` holds a receipt's moved strays to the files its bundle holds under
`strays/`, so a stray dropped from one but kept in the other is caught. A consistent edit is
not: a moved stray deleted with its entry (and its hashes), or a removed stray's entry dropped
(it never left a file), leaves nothing in the bundle to hold the receipt to; only a signature
catches that.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from pathlib import Path

from harness.evidence.files import UNREADABLE, open_folders, unsafe_name, walk
from harness.schema.layout import (
    LAUNCH_NAME,
    LOGS_DIR,
    MERGED_JUNIT,
    RECEIPT_NAME,
    STRAYS_DIR,
    SUMMARY_NAME,
    SUMS_NAME,
)
from harness.schema.receipt import Receipt, Stray

# Names the writer creates; a file a test wrote under one of them is not the writer's.
BUNDLE_NAMES = frozenset({RECEIPT_NAME, SUMMARY_NAME, SUMS_NAME, MERGED_JUNIT, LAUNCH_NAME})
MOVED = "moved to "
# Folders the launcher writes into once the ranks ran (their logs by global rank, in
# harness.launch.ranklogs): a file the run left at such a name would stop it.
WRITTEN_FOLDERS = frozenset({LOGS_DIR})


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
    """A name UTF-8 text can hold: a byte that is not UTF-8 is written as `_xNN`."""
    clean = relpath.replace("\\", "_").replace("\n", "_").replace("\r", "_")
    return re.sub("[\udc80-\udcff]", lambda m: f"_x{ord(m[0]) - 0xDC00:02x}", clean)


def _free(target: Path) -> Path:
    while target.exists() or target.is_symlink():
        target = target.with_name(target.name + "~")
    return target


def _in_the_way(relpath: str) -> bool:
    """At, under, or a folder of a name the writer writes (`strays/` included): a run's file
    there would pass for the writer's or stop it."""
    if relpath in WRITTEN_FOLDERS:
        return True
    for name in (*BUNDLE_NAMES, STRAYS_DIR):
        if relpath == name or relpath.startswith(name + "/") or name.startswith(relpath + "/"):
            return True
    return False


def _remove_folders(folder: Path) -> None:
    """Remove a tree that holds only (empty) folders; anything else in it is left alone."""
    for dirpath, _, _ in os.walk(folder, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


def _remove_unreadable(out_dir: Path, path: Path, relpath: str) -> Stray:
    """A folder that cannot be listed even once given back to its owner is removed; only an
    empty one can be (what cannot be listed cannot be emptied), so any other stops the bundle."""
    try:
        if path == out_dir:  # never removed, even empty
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        os.rmdir(path)
    except OSError as exc:
        why = f"{relpath} in {out_dir} can be neither listed nor removed"
        raise OSError(exc.errno, why, str(path)) from exc
    return Stray(path=_safe(relpath), kind=UNREADABLE, action="removed")


def set_aside(out_dir: Path) -> list[Stray]:
    """Remove links and special files; move bundle-named, unlistable and strays/ files of the
    run under the bundle's own strays/; remove folders where the writer writes a file. Folders
    the run locked are given back to their owner first, and one that stays locked is removed."""
    out_dir = Path(out_dir)
    found: list[Stray] = []
    moving = []
    open_folders(out_dir)
    for entry in walk(out_dir):  # links first: a link named `strays` must not be written through
        if entry.kind == UNREADABLE:
            found.append(_remove_unreadable(out_dir, entry.path, entry.relpath))
        elif entry.kind != "file":
            kind = _kind(entry.path)
            os.unlink(entry.path)  # a link is removed itself, never what it points to
            found.append(Stray(path=_safe(entry.relpath), kind=kind, action="removed"))
        elif _in_the_way(entry.relpath) or unsafe_name(entry.relpath):
            moving.append(entry)
    # Staged outside every name in the way, so that the run's own `strays` (a file, or a folder
    # of its files) is gone before the bundle's is made.
    staged = []
    if moving:
        stage = Path(tempfile.mkdtemp(prefix=".dcpqual-strays-", dir=out_dir))
        for i, entry in enumerate(moving):
            os.replace(entry.path, stage / str(i))
            staged.append((stage / str(i), _safe(entry.relpath)))
    for name in sorted({*BUNDLE_NAMES, STRAYS_DIR}):
        folder = out_dir / name
        if folder.is_dir() and not folder.is_symlink():
            _remove_folders(folder)
            if name != STRAYS_DIR:
                found.append(Stray(path=name, kind="folder", action="removed"))
    for source, shown in staged:
        target = _free(out_dir / STRAYS_DIR / shown)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError:  # two names made one by `_safe`, a file and a folder: flatten it
            target = _free(out_dir / STRAYS_DIR / shown.replace("/", "_"))
        os.replace(source, target)
        where = target.relative_to(out_dir).as_posix()
        found.append(Stray(path=shown, kind="file", action=MOVED + where))
    if staged:
        staged[0][0].parent.rmdir()
    return sorted(found, key=lambda s: s.path)


def strays_problems(bundle: Path, receipt: Receipt) -> list[str]:
    """Every file under the bundle's strays/ is named by a stray moved there, and every stray
    moved there is in the bundle; a stray is removed or moved under strays/, nothing else."""
    prefix = STRAYS_DIR + "/"
    held = {e.relpath for e in walk(bundle) if e.relpath.startswith(prefix)}
    problems: list[str] = []
    named: dict[str, str] = {}
    for stray in receipt.run.extra.strays:
        if stray.action == "removed":
            continue
        target = stray.action.removeprefix(MOVED)
        if not stray.action.startswith(MOVED) or not target.startswith(prefix):
            problems.append(
                f"{RECEIPT_NAME}: run.extra.strays: {stray.path} was {stray.action!r}, neither "
                f"removed nor moved under {prefix}"
            )
        elif target in named:
            problems.append(
                f"{RECEIPT_NAME}: run.extra.strays: {stray.path} and {named[target]} were both "
                f"moved to {target}"
            )
        else:
            named[target] = stray.path
            if target not in held:
                problems.append(
                    f"{target}: missing ({RECEIPT_NAME} run.extra.strays says {stray.path} was "
                    "moved there)"
                )
    for rel in sorted(held - set(named)):
        problems.append(f"{rel}: under {prefix} but no stray in {RECEIPT_NAME} was moved there")
    return problems
