"""Atomic file writes: a reader sees the old file or the whole new one, never half of either.

One implementation for every package that writes evidence, rank records, node markers or locks.
It lives at the top of `harness` (not in `evidence`) because rank-side code must not import the
evidence writer.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path


def link_on_the_way(root: Path, path: Path) -> Path | None:
    """The first link below `root` on the way to `path` (`path` included), None where there is
    none; a part that does not exist yet is no link. `path` must be under `root`."""
    current = Path(root)
    for part in Path(path).relative_to(root).parts:
        current = current / part
        if current.is_symlink():
            return current
    return None


def atomic_write_bytes(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o644,
    fsync: bool = True,
    within: Path | None = None,
) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename.

    The temporary file is removed if anything fails. `fsync=False` skips the flush to disk for
    files rewritten often (rank records after every test), where surviving the death of the
    process, which the rename already gives, is what matters. `within`: the folder the write
    must stay in; a link below it on the way to `path`'s folder (one a rank made) is refused
    with OSError, never written through. A link at `path` itself is replaced, never followed.
    """
    if within is not None and (link := link_on_the_way(within, path.parent)) is not None:
        raise OSError(errno.ELOOP, f"{link} is a link; nothing is written through it", str(link))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def atomic_write_text(
    path: Path, text: str, *, mode: int = 0o644, fsync: bool = True, within: Path | None = None
) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode, fsync=fsync, within=within)
