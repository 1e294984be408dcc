"""Scrubbing a folder in place: every name and every regular file's contents, with the
secrets and shapes `harness.core.secrets` defines, so that no ending (a pass, a failure, a full
disk) leaves a raw secret in what it writes.

Why in place and at any cost: the folder is the evidence. A file that cannot be rewritten
atomically (no block for the temporary file) is rewritten in place, never growing; one that
cannot be read, renamed or rewritten is removed and named; what cannot even be removed stops the
bundle (`ScrubFailed`). Large text files are scrubbed a block at a time (a rank's log can be
gigabytes: read whole, it would cost the launcher that much memory, and an OOM kill leaves every
secret).
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from harness.atomic import atomic_write_bytes
from harness.core.livescrub import WRAPPED_LINE_END
from harness.core.secrets import GZIP_LIMIT, GZIP_MAGIC, SCRUBBED, Scrubber
from harness.evidence.files import open_folders, walk_folders


@dataclass(frozen=True)
class ScrubReport:
    """What scrubbing a folder changed: files whose bytes changed, names that were renamed;
    of the changed files those rewritten in place (the atomic rewrite failed: a full disk),
    and files removed because they could be neither read, renamed nor rewritten."""

    changed: tuple[str, ...]
    renamed: tuple[tuple[str, str], ...]
    in_place: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


class ScrubFailed(Exception):
    """Files that still hold a secret: they could be neither scrubbed nor removed. Nothing
    may be written from such a folder (scrubbed names, never the secret, are listed)."""

    def __init__(self, left: Iterable[str], why: str) -> None:
        self.left = tuple(left)
        holds = "holds" if len(self.left) == 1 else "hold"
        super().__init__(f"{', '.join(self.left)} still {holds} a secret ({why})")


def mask_filler(length: int) -> str:
    """What replaces a secret where the file may not grow: as many characters as it had."""
    return SCRUBBED.ljust(length, "*") if length >= len(SCRUBBED) else "*" * length


def _masked(scrubber: Scrubber, data: bytes) -> bytes:
    """`data` with every secret form and shape replaced by a filler of its own length (never
    longer)."""
    for form in scrubber.forms:
        raw = form.encode("utf-8")
        data = data.replace(raw, mask_filler(len(raw)).encode())
    return scrubber._beyond_forms_data(data, mask_filler)[0]


def _overwrite(path: Path, data: bytes) -> None:
    """Write `data` over the start of `path` and cut the file there: the same inode, and for
    data no longer than the file no new block (what a full disk still allows)."""
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        view, done = memoryview(data), 0
        while done < len(data):
            wrote = os.pwrite(fd, view[done:], done)
            if wrote <= 0:
                raise OSError(errno.EIO, f"nothing written over {path.name}")
            done += wrote
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def _named(relpath: str, scrubber: Scrubber) -> str:
    """A path as a report names it: no form whole, within a name or across names."""
    return scrubber.name(scrubber.text(relpath)[0])


def _remove(
    path: Path, root: Path, scrubber: Scrubber, removed: list[str], left: list[str]
) -> None:
    """Remove a file (or a folder and what it holds) that cannot be scrubbed, naming each file;
    what cannot even be removed is left for `ScrubFailed`."""
    files = [path] if not path.is_dir() or path.is_symlink() else _regular_files(path) or [path]
    names = [_named(f.relative_to(root).as_posix(), scrubber) for f in files]
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError:
        left.extend(n for f, n in zip(files, names, strict=True) if f.exists())
        names = [n for f, n in zip(files, names, strict=True) if not f.exists()]
    removed.extend(names)


def _rewrite(path: Path, clean: bytes, data: bytes, scrubber: Scrubber) -> bool:
    """Replace `path`'s bytes with `clean`; True where it had to be done in place.

    Atomically first. Where that fails (no block for the temporary file: a full disk or
    quota), in place: `clean` where it is no longer than the file, else the file's own bytes
    with each secret masked to its length, so the file never grows. Raises OSError when even
    that fails; the caller removes the file.
    """
    try:
        atomic_write_bytes(path, clean)
        return False
    except OSError:
        pass
    if len(clean) > len(data) and data[:2] == GZIP_MAGIC:
        # masking the compressed bytes would leave what they hold: the caller removes it
        raise OSError(errno.ENOSPC, f"no room to scrub the gzip file {path.name}")
    _overwrite(path, clean if len(clean) <= len(data) else _masked(scrubber, data))
    return True


def _remove_unlistable(
    folder: Path, root: Path, scrubber: Scrubber, removed: list[str], left: list[str]
) -> None:
    """Remove a folder that cannot be listed, naming it (`name/`): it may hold a secret no scrub
    can see. Only an empty one can go (what cannot be listed cannot be emptied); any other is
    left for `ScrubFailed`, as `root` itself is."""
    if folder == root:
        left.append("./")
        return
    name = _named(folder.relative_to(root).as_posix(), scrubber) + "/"
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        return
    except OSError:
        left.append(name)
        return
    removed.append(name)


def _regular_files(root: Path, unlisted: list[Path] | None = None) -> list[Path]:
    """Regular files under `root`, links and special files left alone (a FIFO is never read);
    the folders the walk could not list are added to `unlisted`."""
    found = []
    for dirpath, _dirnames, filenames in walk_folders(root, [] if unlisted is None else unlisted):
        base = Path(dirpath)
        for name in filenames:
            path = base / name
            if not path.is_symlink() and path.is_file():
                found.append(path)
    return sorted(found)


# Text files larger than this are scrubbed a block at a time (a rank's log can be gigabytes:
# read whole, it would cost the launcher that much memory, and an OOM kill leaves every secret).
STREAM_BYTES = 32 << 20
STREAM_BLOCK = 4 << 20


def _streamed(path: Path) -> bool:
    return not path.name.endswith((".json", ".xml")) and path.stat().st_size > STREAM_BYTES


def _cut(buffer: bytes, longest: int, forms: tuple[bytes, ...] = ()) -> int:
    """Where `buffer` may be cut so that no secret's form (of `forms`, `longest` the longest),
    no `NAME=value` and no wrapped encoding straddles the cut: after a line break (the last one
    whose line is not a line of wrapped base64), else after the last whitespace, else
    `longest` bytes from the end; moved back before any form it would cut. 0 when there is no
    safe cut yet (a form at the very start): the caller reads on."""
    floor = max(len(buffer) // 2, 1)
    at = buffer.rfind(b"\n", floor)
    before_run = -1  # the line break before a run of wrapped base64 lines
    while at != -1 and WRAPPED_LINE_END.search(buffer[max(0, at - 80) : at + 1]):
        before_run = buffer.rfind(b"\n", 0, at)
        at = buffer.rfind(b"\n", floor, at)
    if at == -1 and before_run > 0:
        at = before_run
        while at > 0 and WRAPPED_LINE_END.search(buffer[max(0, at - 80) : at + 1]):
            at = buffer.rfind(b"\n", 0, at)  # back to where the run begins
    if at == -1:
        at = max(buffer.rfind(b" ", floor), buffer.rfind(b"\t", floor))
    cut = at + 1 if at > 0 else max(len(buffer) - longest, 0)
    moved = True
    while moved:  # a form straddling the cut: cut before it (and look again from there)
        moved = False
        low = max(0, cut - longest)
        window = buffer[low : cut + longest]
        for form in forms:
            start = window.find(form)
            while start != -1:
                if low + start < cut < low + start + len(form):
                    cut, moved = low + start, True
                    break
                start = window.find(form, start + 1)
            if moved:
                break
    return cut  # 0: no safe cut yet, read more


def _scrub_blocks(
    read: Callable[[int], bytes], write: Callable[[bytes], object], scrubber: Scrubber, block: int
) -> int:
    """Scrub what `read` gives, a block at a time, into `write`; the replacements. Blocks are cut
    where no form or shape can straddle the cut (`_cut`), and a form cut by a forced cut is
    found by keeping the last `longest` bytes for the next block."""
    forms = tuple(f.encode("utf-8") for f in scrubber.forms)
    longest = max((len(f) for f in forms), default=0) + 1
    hits = 0
    carry = b""
    while True:
        chunk = read(block)
        buffer = carry + chunk
        if not chunk:
            clean, more = scrubber.data(buffer)
            write(clean)
            return hits + more
        at = _cut(buffer, longest, forms)
        if at == 0:
            carry = buffer
            continue
        clean, more = scrubber.data(buffer[:at])
        write(clean)
        hits += more
        carry = buffer[at:]


def scrub_stream(path: Path, scrubber: Scrubber, block: int | None = None) -> int:
    """Scrub a large text file a block at a time into a new file beside it, then put it in
    place; memory stays about two blocks whatever the file's size (`_scrub_blocks`). Returns
    the replacements; OSError (a full disk) is the caller's, which removes the file."""
    size = STREAM_BLOCK if block is None else block

    def fill(dst: BinaryIO) -> int:
        with open(path, "rb") as src:
            return _scrub_blocks(src.read, dst.write, scrubber, size)

    return _write_beside(path, fill) or 0


def _write_beside(path: Path, fill: Callable[[BinaryIO], int | None]) -> int | None:
    """`fill` writes the file's scrubbed bytes into a new file beside it and returns the
    replacements (None: the file is the caller's as it is); where there are any, the new file
    takes the old one's place, synced first. Returns what `fill` did."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:40]}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as dst:
            hits = fill(dst)
            dst.flush()
            os.fsync(dst.fileno())
        if hits:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return hits


class _Gunzip:
    """What a gzip file holds (every member), read a block at a time: `read(n)` gives up to `n`
    bytes, b"" at the end. Where the compressed bytes end early or go wrong (a test killed while
    it wrote, bytes after the last member), it ends there and says so (`broken`)."""

    def __init__(self, src: BinaryIO) -> None:
        self.src = src
        self.member = zlib.decompressobj(wbits=31)
        self.pending = b""
        self.done = False
        self.broken = False

    def read(self, size: int) -> bytes:
        out = bytearray()
        while len(out) < size and not self.done:
            if not self.pending:
                self.pending = self.src.read(STREAM_BLOCK)
                if not self.pending:  # the file ended inside a member
                    self.broken = self.done = True
                    break
            try:
                out += self.member.decompress(self.pending, size - len(out))
            except zlib.error:
                self.broken = self.done = True
                break
            self.pending = self.member.unconsumed_tail
            if self.member.eof:
                self.pending = self.member.unused_data + self.pending
                self.member = zlib.decompressobj(wbits=31)
                if not self.pending:
                    self.pending = self.src.read(STREAM_BLOCK)
                    if not self.pending:
                        self.done = True
        return bytes(out)


def scrub_gzip_stream(path: Path, scrubber: Scrubber, block: int | None = None) -> int | None:
    """Scrub what a gzip file holds a block at a time (`_scrub_blocks`) and compress it again,
    into a new file beside it, then put it in place: a gzip file too large to scrub in memory
    (`GZIP_LIMIT` decompressed, `STREAM_BYTES` compressed). A gzip file that breaks off (a test
    killed while it wrote, bytes after the last member) is scrubbed as far as it can be read;
    where that holds a secret, what follows the break is dropped (no reader could decompress
    it), else None: the file's bytes are the caller's to scrub, as those of a file that is no
    gzip at all. OSError (a full disk) is the caller's, which removes the file."""
    size = STREAM_BLOCK if block is None else block

    def fill(dst: BinaryIO) -> int | None:
        with open(path, "rb") as src:
            source = _Gunzip(src)
            with gzip.GzipFile(fileobj=dst, mode="wb", mtime=0) as packed:
                hits = _scrub_blocks(source.read, packed.write, scrubber, size)
        # A break with no secret before it: what follows may be plain bytes, the caller's.
        return None if source.broken and not hits else hits

    return _write_beside(path, fill)


def _gzip_too_large(path: Path) -> bool:
    """A gzip file that `Scrubber.file_bytes` cannot scrub inside: too large to read whole, or
    holding more than `GZIP_LIMIT` bytes."""
    with open(path, "rb") as src:
        if src.read(2) != GZIP_MAGIC:
            return False
    return path.stat().st_size > STREAM_BYTES or _inflates_past_limit(path)


def _inflates_past_limit(path: Path) -> bool:
    """Whether the gzip file holds more than GZIP_LIMIT bytes (read, never held, a block at a
    time)."""
    with open(path, "rb") as src:
        source = _Gunzip(src)
        held = 0
        while chunk := source.read(STREAM_BLOCK):
            held += len(chunk)
            if held > GZIP_LIMIT:
                return True
        return source.broken


def _across_names(relpaths: Iterable[str], scrubber: Scrubber) -> dict[str, list[tuple[int, int]]]:
    """Where a secret's form spans several names of a path (a value with a '/' in it, an AWS
    secret key or its base64, made a path: `cache/wJalr.../K7MDENG/bPxRfi....json`): for each
    path that ends in such a name, the spans of its last name that the form covers. Each name
    alone holds only a piece of the form, which the scrub of names one by one never finds."""
    forms = [form for form in scrubber.forms if "/" in form.strip("/")]
    covered: dict[str, list[tuple[int, int]]] = {}
    for relpath in relpaths:
        for form in forms:
            start = relpath.find(form)
            while start != -1:
                end, at = start + len(form), 0
                for name in relpath.split("/"):
                    low, high = max(at, start), min(at + len(name), end)
                    if low < high:
                        key = relpath[: at + len(name)]
                        covered.setdefault(key, []).append((low - at, high - at))
                    at += len(name) + 1
                start = relpath.find(form, start + 1)
    return covered


def _clean_name(name: str, spans: list[tuple[int, int]], scrubber: Scrubber) -> str:
    """A name with the pieces of forms across names (`spans`) and every form in it replaced."""
    for start, end in sorted(set(spans), reverse=True):
        name = name[:start] + SCRUBBED + name[end:]
    return scrubber.name(name)


def _clean_path(relpath: str, across: dict[str, list[tuple[int, int]]], scrubber: Scrubber) -> str:
    """A path as a report names it: each name cleaned as `_clean_name` (the folders above a
    renamed one are renamed later, deepest first), so no piece of a form across names shows."""
    parts = relpath.split("/")
    return "/".join(
        _clean_name(name, across.get("/".join(parts[: i + 1]), []), scrubber)
        for i, name in enumerate(parts)
    )


def scrub_folder(root: Path, scrubber: Scrubber) -> ScrubReport:
    """Scrub every name under `root`, then every regular file's contents, in place.

    Contents are rewritten atomically; a name holding a secret, or a piece of one that spans
    several names (`_across_names`), is renamed (never onto an existing name). Links and special
    files are not followed or read. A folder its owner cannot list or enter (a rank may leave one
    at mode 000) is given back to the owner first, and one that still cannot be listed is
    removed. A full disk leaves no secret: a file that cannot be
    rewritten atomically is rewritten in place, and a file that cannot be read, renamed or
    rewritten at all is removed; the report names both. `ScrubFailed` where a file holding a
    secret, or a folder that cannot be listed, cannot even be removed.
    """
    changed: list[str] = []
    renamed: list[tuple[str, str]] = []
    if not scrubber:
        return ScrubReport((), ())
    in_place: list[str] = []
    removed: list[str] = []
    left: list[str] = []
    for folder in open_folders(root):
        _remove_unlistable(folder, root, scrubber, removed, left)
    unlisted: list[Path] = []
    # Names first, deepest first, so renaming a folder never invalidates a path still to visit.
    entries = sorted(
        (Path(d) / n for d, ds, fs in walk_folders(root, unlisted) for n in [*ds, *fs]),
        key=lambda p: (-len(p.parts), str(p)),
    )
    across = _across_names((p.relative_to(root).as_posix() for p in entries), scrubber)
    for path in entries:
        spans = across.get(path.relative_to(root).as_posix(), [])
        clean = _clean_name(path.name, spans, scrubber)
        if clean == path.name:
            continue
        target = path.with_name(clean)
        while target.exists() or target.is_symlink():
            target = target.with_name(target.name + "~")
        try:
            path.rename(target)
        except OSError:
            _remove(path, root, scrubber, removed, left)
            continue
        renamed.append(
            (
                _clean_path(path.relative_to(root).as_posix(), across, scrubber),
                _clean_path(target.relative_to(root).as_posix(), across, scrubber),
            )
        )
    for path in _regular_files(root, unlisted):
        relpath = path.relative_to(root).as_posix()
        try:
            streamed = scrub_gzip_stream(path, scrubber) if _gzip_too_large(path) else None
            if streamed is not None:
                hits = streamed
            elif _streamed(path):
                hits = scrub_stream(path, scrubber)
            else:
                data = path.read_bytes()
                clean_bytes, hits = scrubber.file_bytes(path.name, data)
                if hits and _rewrite(path, clean_bytes, data, scrubber):
                    in_place.append(relpath)
        except OSError:
            _remove(path, root, scrubber, removed, left)
            continue
        if hits:
            changed.append(relpath)
    for folder in sorted(set(unlisted)):  # opened, and locked again since
        _remove_unlistable(folder, root, scrubber, removed, left)
    if left:
        raise ScrubFailed(sorted(set(left)), "could be neither scrubbed nor removed")
    return ScrubReport(
        tuple(sorted(set(changed))),
        tuple(sorted(renamed)),
        in_place=tuple(sorted(set(in_place))),
        removed=tuple(sorted(set(removed))),
    )
