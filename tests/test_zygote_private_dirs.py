"""A launcher killed before it removed its zygote's socket folder in /tmp (an out path too long
for a Unix socket) leaves it behind; the next launch removes it, and only it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.launch.plan import PRIVATE_PREFIX, remove_stale_private_dirs, zygote_socket


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_folder_of_a_gone_launcher_is_removed_and_a_live_one_s_kept(tmp_path: Path) -> None:
    dead = tmp_path / f"{PRIVATE_PREFIX}{_dead_pid()}-0123456789abcdef"
    live = tmp_path / f"{PRIVATE_PREFIX}{os.getpid()}-fedcba9876543210"
    odd = tmp_path / f"{PRIVATE_PREFIX}{_dead_pid()}-with-more"
    for folder in (dead, live, odd):
        folder.mkdir(mode=0o700)
        (folder / "zygote.sock").write_text("")
    (odd / "not-a-socket").write_text("kept")
    assert remove_stale_private_dirs(tmp_path) == [dead]
    assert not dead.exists() and live.is_dir() and (odd / "not-a-socket").is_file()


def test_a_long_out_path_names_the_launcher_in_its_private_folder(tmp_path: Path) -> None:
    socket, private = zygote_socket(tmp_path / ("x" * 120))
    assert private is not None and socket.parent == private
    assert private.name.startswith(f"{PRIVATE_PREFIX}{os.getpid()}-")
