"""Folders their owner cannot list (mode 000, 0o300, 0o400), for this process whoever it is.

A normal user is held to a folder's mode bits by the kernel. Root is not (CAP_DAC_OVERRIDE lists
and enters a mode-000 folder), so where the bits do not stop this process `hold_to_modes` swaps
`os.scandir` (what `os.walk`, `shutil.rmtree` and `Path.glob` list with) for one that refuses as
the kernel refuses the folder's owner: a folder without its owner's read bit, or under one
without its search bit. Where the kernel holds this process to the bits, nothing is swapped and
the real refusals are what the tests see.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import pytest

_real_scandir = os.scandir


def modes_bind(where: Path) -> bool:
    """True where the kernel itself refuses this process a folder of mode 000 under `where`."""
    probe = where / ".modes-probe"
    probe.mkdir()
    os.chmod(probe, 0)
    try:
        os.listdir(probe)
    except PermissionError:
        return True
    else:
        return False
    finally:
        os.chmod(probe, 0o700)
        probe.rmdir()


def _refused(path: Any) -> PermissionError:
    return PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)


def _owner_scandir(path: Any = ".") -> Any:
    if isinstance(path, int):  # an open folder: only its own read bit is left to check
        if not os.fstat(path).st_mode & stat.S_IRUSR:
            raise _refused(path)
        return _real_scandir(path)
    folder = Path(os.path.abspath(os.fspath(path)))
    if any(not os.stat(up).st_mode & stat.S_IXUSR for up in folder.parents):
        raise _refused(os.fspath(path))
    if not os.stat(folder).st_mode & stat.S_IRUSR:
        raise _refused(os.fspath(path))
    return _real_scandir(path)


def hold_to_modes(monkeypatch: pytest.MonkeyPatch, where: Path) -> None:
    """From now on listing a folder obeys its owner's mode bits, as for a normal user."""
    if not modes_bind(where):
        monkeypatch.setattr(os, "scandir", _owner_scandir)


def lock(folder: Path, mode: int = 0) -> Path:
    """`folder` (created if needed) with `mode`, as a rank might leave it."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, mode)
    return folder


def unlock_all(root: Path) -> None:
    """Every folder under `root` back to u+rwx, so a test can look inside what the code under
    test may have left locked (a walk would skip it, and a check that skips passes)."""
    os.chmod(root, 0o700)
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                os.chmod(path, 0o700)


def refuse_chmod(monkeypatch: pytest.MonkeyPatch, under: Path) -> None:
    """From now on no folder's mode under `under` can be changed (a folder the run does not
    own, or one made immutable); files' modes still can (the atomic writer sets them)."""
    real = os.chmod

    def chmod(path: Any, mode: int, **kwargs: Any) -> None:
        where = None if isinstance(path, int) else Path(os.path.abspath(os.fspath(path)))
        if where is not None and where.is_relative_to(under.absolute()) and where.is_dir():
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), os.fspath(path))
        real(path, mode, **kwargs)

    monkeypatch.setattr(os, "chmod", chmod)
