"""Read a JSON file that may be hostile: bounded in size and depth, regular files only, strict.

Every JSON file the CLI reads (receipts, rank records, source locks, node markers, image
identities) comes from disk a test, a user or an attacker could have written. Python's own
`json.loads` hangs on a FIFO, reads /dev/zero until memory runs out, recurses until it crashes on
deep nesting, keeps the last of two duplicate keys and accepts NaN. Here:

- the path is opened non-blocking and must be a regular file (a FIFO or device is refused before
  a byte is read), and no more than `max_bytes` are ever read;
- nesting deeper than `max_depth` is refused before parsing;
- duplicate keys and the non-JSON constants NaN/Infinity are syntax errors, so a file has one
  meaning only;
- numbers are bounded: an integer of more than `MAX_INT_DIGITS` digits (Python refuses to
  convert one of thousands with a ValueError of its own) and a number that overflows to
  infinity (`1e999`) are syntax errors too.

Two kinds of failure: `JsonFileRefused` (a UsageError: the file is not something to parse at
all, so the command stops with one line and exit 2) and `JsonSyntaxError` (a ValueError: the
file was read but is not strict JSON; a checker may report it as one of its problems).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from harness.errors import UsageError

MAX_BYTES = 64 << 20  # far above any receipt or rank record a 16-rank run writes
MAX_DEPTH = 64  # receipts and records nest about 8 deep
MAX_INT_DIGITS = 40  # far above any count, size, pid or nanosecond time a file holds
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # unrolled: linear and fast
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class JsonFileRefused(UsageError):
    """The file is not a regular file, too large or too deeply nested: not parsed at all."""


class JsonSyntaxError(ValueError):
    """The file was read but is not strict JSON (syntax, encoding, duplicate key, NaN)."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def read_bounded(path: Path, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; refuses anything else unread."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise JsonFileRefused(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise JsonFileRefused(f"{path}: is {_kind(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            raise JsonFileRefused(
                f"{path}: is {info.st_size} bytes, more than the {max_bytes} a JSON file may be"
            )
        chunks: list[bytes] = []
        left = max_bytes + 1  # one more than allowed: a file that grew while read is caught
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise JsonFileRefused(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise JsonFileRefused(f"{path}: grew past the {max_bytes} bytes a JSON file may be")
    return data


def nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON text (strings do not count)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = deepest = 0
    for char in brackets:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JsonSyntaxError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise JsonSyntaxError(f"{name} is not a JSON value")


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise JsonSyntaxError(
            f"an integer of {digits} digits, more than the {MAX_INT_DIGITS} a number may have"
        )
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise JsonSyntaxError(f"the number {text[:20]}... overflows to infinity")
    return value


def loads_strict(text: str, *, max_depth: int = MAX_DEPTH, where: str = "JSON") -> Any:
    """Parse JSON text strictly; JsonFileRefused when nested deeper than `max_depth`."""
    depth = nesting_depth(text)
    if depth > max_depth:
        raise JsonFileRefused(f"{where}: nests {depth} deep, more than the {max_depth} allowed")
    try:
        return json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
            parse_int=_bounded_int,
            parse_float=_finite_float,
        )
    except json.JSONDecodeError as exc:
        raise JsonSyntaxError(f"line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def read_json(path: Path, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """The strict JSON value of a bounded regular file (see the module docstring)."""
    data = read_bounded(Path(path), max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonSyntaxError(f"not UTF-8 text: {exc}") from None
    return loads_strict(text, max_depth=max_depth, where=str(path))
