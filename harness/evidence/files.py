"""Bytes on disk for the evidence bundle: atomic writes, file walks and `SHA256SUMS`.

A bundle is read by people who were not there, so no file in it may ever be half-written (every
write goes to a temporary file in the same folder and is renamed over the target) and every file
is covered by `SHA256SUMS` in the format `sha256sum -c` reads: `<64 hex>  <relative path>`, one
line per file, sorted by path, LF line ends.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.schema.base import is_sha256
from harness.schema.layout import SUMS_NAME

# The kind of an entry a walk could not look into: a folder that cannot be listed (mode 000 or
# 0o300), or a name inside a folder that cannot be entered (0o400).
UNREADABLE = "unreadable"
_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")
# Characters `sha256sum` would have to escape; we refuse them instead of escaping.
# Backslash and line breaks, and the surrogates `os.fsdecode` turns bytes that are not UTF-8
# into (SHA256SUMS and the receipt are UTF-8 text: such a name cannot be written in them).
_UNSAFE_NAME = re.compile(r"[\\\n\r\udc80-\udcff]")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One thing found under a bundle folder, by its POSIX path relative to the folder."""

    relpath: str
    path: Path
    kind: str  # "file" | "symlink" | "other" | UNREADABLE


def walk_folders(root: Path, unlisted: list[Path]) -> Iterator[tuple[str, list[str], list[str]]]:
    """`os.walk` of `root`, links not followed, that adds every folder it cannot list to
    `unlisted` instead of skipping it silently (one gone meanwhile held nothing)."""
    root = Path(root)

    def note(error: OSError) -> None:
        if not isinstance(error, FileNotFoundError | NotADirectoryError):
            unlisted.append(root if error.filename is None else Path(error.filename))

    return os.walk(root, followlinks=False, onerror=note)


def walk(root: Path) -> Iterator[Entry]:
    """Every non-directory entry under `root`, sorted by relative path; links are not followed.
    What the walk cannot look into is an UNREADABLE entry, never skipped: nothing under it could
    be hashed or checked. A `root` that is not there holds nothing."""
    root = Path(root)
    found: list[Entry] = []
    unlisted: list[Path] = []
    for dirpath, dirnames, filenames in walk_folders(root, unlisted):
        base = Path(dirpath)
        names = list(filenames)
        # os.walk lists links to folders among dirnames; they are entries, not folders to enter.
        for d in list(dirnames):
            if os.path.islink(base / d):
                dirnames.remove(d)
                names.append(d)
        for name in names:
            path = base / name
            try:
                kind = _kind(os.lstat(path).st_mode)
            except FileNotFoundError:  # gone meanwhile
                continue
            except OSError:
                kind = UNREADABLE
            found.append(Entry(path.relative_to(root).as_posix(), path, kind))
    found += [Entry(p.relative_to(root).as_posix(), p, UNREADABLE) for p in unlisted]
    return iter(sorted(found, key=lambda e: e.relpath))


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):  # a folder the walk did not enter: it could not tell it was one
        return UNREADABLE
    return "other"


def open_folders(root: Path) -> list[Path]:
    """Give every folder under `root` that its owner cannot list or enter back to the owner
    (u+rwx, top down), so that no walk misses what it holds; the folders that still cannot be
    listed (not the run's own, immutable). Links are neither followed nor changed."""
    root = Path(root)
    unlisted: list[Path] = []
    _let_in(root)
    for dirpath, dirnames, _ in walk_folders(root, unlisted):
        for name in dirnames:
            _let_in(Path(dirpath) / name)
    return sorted(unlisted)


def _let_in(folder: Path) -> None:
    try:
        mode = os.lstat(folder).st_mode
        if stat.S_ISDIR(mode) and mode & stat.S_IRWXU != stat.S_IRWXU:
            os.chmod(folder, stat.S_IMODE(mode) | stat.S_IRWXU)
    except OSError:
        pass  # the walk that follows names it if it still cannot be listed


def unsafe_name(relpath: str) -> bool:
    """True for names `SHA256SUMS` could not carry without escaping (backslash, newline, a
    byte that is not UTF-8)."""
    return bool(_UNSAFE_NAME.search(relpath))


def render_sums(sums: dict[str, str]) -> str:
    """The canonical `SHA256SUMS` text for {relative path: sha256}."""
    for rel, digest in sums.items():
        if not is_sha256(digest):
            raise ValueError(f"not a sha256 hex digest for {rel!r}: {digest!r}")
        if unsafe_name(rel) or rel.startswith("/") or ".." in rel.split("/"):
            raise ValueError(f"cannot list {rel!r} in {SUMS_NAME}")
    return "".join(f"{sums[rel]}  {rel}\n" for rel in sorted(sums))


@dataclass(frozen=True)
class ParsedSums:
    """`SHA256SUMS` as read back: the entries, and what was wrong with the text itself."""

    entries: dict[str, str]
    problems: tuple[str, ...]


def parse_sums(text: str) -> ParsedSums:
    """Parse `sha256sum` output leniently, reporting every line that does not fit the format."""
    entries: dict[str, str] = {}
    problems: list[str] = []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    else:
        problems.append("does not end with a newline")
    for number, line in enumerate(lines, start=1):
        match = _LINE.match(line)
        if not match:
            problems.append(f"line {number} is not '<sha256>  <path>': {line[:80]!r}")
            continue
        digest, rel = match.groups()
        if rel.startswith("/") or ".." in rel.split("/") or unsafe_name(rel):
            problems.append(f"line {number} names a path outside the bundle: {rel!r}")
            continue
        if rel in entries:
            problems.append(f"line {number} lists {rel} a second time")
            continue
        entries[rel] = digest
    if not problems and text != render_sums(entries):
        problems.append("is not in canonical form (sorted paths, two spaces, LF)")
    return ParsedSums(entries, tuple(problems))


def hash_files(root: Path, relpaths: Iterable[str]) -> dict[str, str]:
    return {rel: sha256_file(root / rel) for rel in relpaths}
