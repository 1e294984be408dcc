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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.schema.base import is_sha256

SUMS_NAME = "SHA256SUMS"
_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")
# Characters `sha256sum` would have to escape; we refuse them instead of escaping.
_UNSAFE_NAME = re.compile(r"[\\\n\r]")


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
    kind: str  # "file" | "symlink" | "other"


def walk(root: Path) -> Iterator[Entry]:
    """Every non-directory entry under `root`, sorted by relative path; links are not followed."""
    found: list[Entry] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        names = list(filenames)
        # os.walk lists links to folders among dirnames; they are entries, not folders to enter.
        for d in list(dirnames):
            if (base / d).is_symlink():
                dirnames.remove(d)
                names.append(d)
        for name in names:
            path = base / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                kind = "symlink"
            elif path.is_file():
                kind = "file"
            else:
                kind = "other"
            found.append(Entry(rel, path, kind))
    return iter(sorted(found, key=lambda e: e.relpath))


def unsafe_name(relpath: str) -> bool:
    """True for names `SHA256SUMS` could not carry without escaping (backslash, newline)."""
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
