"""A full disk without filling one: what ENOSPC does to the writes the evidence code makes.

On a full disk a new file can still be created (an inode is free) but no data block can be
had: the atomic writer's temporary file is made and its write fails; rewriting bytes a file
already holds needs no new block and works; growing a file fails. `overwrite_fails` models a
copy-on-write filesystem (or a quota with nothing left), where even an overwrite needs a block.
Only the modules named below see the full disk (their `os` is swapped), so pytest's own files
are untouched.
"""

from __future__ import annotations

import errno
import os
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import harness.atomic
import harness.evidence.redact


class _Unwritable:
    """The file object `os.fdopen` gives on a full disk: every byte written fails."""

    def __init__(self, fd: int, code: int) -> None:
        self._fd, self._code = fd, code

    def __enter__(self) -> _Unwritable:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)

    def write(self, data: bytes) -> int:
        raise OSError(self._code, os.strerror(self._code))

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self._fd


def full_os(code: int = errno.ENOSPC, *, overwrite_fails: bool = False) -> Any:
    """An `os` module on a full disk; everything it does not model is the real one."""
    full = types.SimpleNamespace(**{n: getattr(os, n) for n in dir(os) if not n.startswith("__")})

    def fail() -> OSError:
        return OSError(code, os.strerror(code))

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        return _Unwritable(fd, code)

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if overwrite_fails or offset + len(data) > os.fstat(fd).st_size:
            raise fail()
        return os.pwrite(fd, data, offset)

    def write(fd: int, data: bytes) -> int:
        raise fail()

    def ftruncate(fd: int, length: int) -> None:
        if length > os.fstat(fd).st_size:
            raise fail()
        os.ftruncate(fd, length)

    full.fdopen, full.pwrite, full.write, full.ftruncate = fdopen, pwrite, write, ftruncate
    return full


def fill_disk(
    monkeypatch: pytest.MonkeyPatch, code: int = errno.ENOSPC, *, overwrite_fails: bool = False
) -> None:
    """From now on the atomic writer and the scrubber write to a full disk."""
    full = full_os(code, overwrite_fails=overwrite_fails)
    monkeypatch.setattr(harness.atomic, "os", full)
    monkeypatch.setattr(harness.evidence.redact, "os", full)


@contextmanager
def full_disk(code: int = errno.ENOSPC, *, overwrite_fails: bool = False) -> Iterator[None]:
    """The disk is full inside the block, and has room again after it."""
    with pytest.MonkeyPatch.context() as patch:
        fill_disk(patch, code, overwrite_fails=overwrite_fails)
        yield
