"""Atomic writes (harness.atomic), file walks and the SHA256SUMS format."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from _support.locked import hold_to_modes, lock

from harness.atomic import atomic_write_bytes
from harness.evidence.files import (
    parse_sums,
    render_sums,
    sha256_file,
    walk,
)

A = hashlib.sha256(b"a").hexdigest()
B = hashlib.sha256(b"b").hexdigest()


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.json"
    atomic_write_bytes(target, b"old")
    atomic_write_bytes(target, b"new contents")
    assert target.read_bytes() == b"new contents"
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]


def test_atomic_write_failure_keeps_old_file_and_leaves_no_temp(tmp_path: Path, monkeypatch):
    target = tmp_path / "f.json"
    atomic_write_bytes(target, b"old")

    def broken_fsync(fd: int) -> None:
        raise OSError("I/O error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="I/O error"):
        atomic_write_bytes(target, b"half")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_atomic_write_within_a_folder_never_writes_through_a_link_in_it(tmp_path: Path) -> None:
    outside, out = tmp_path / "outside", tmp_path / "out"
    outside.mkdir()
    (out / "a").mkdir(parents=True)
    (out / "a" / "logs").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OSError, match="is a link"):
        atomic_write_bytes(out / "a" / "logs" / "deeper" / "x.txt", b"x", within=out)
    assert list(outside.iterdir()) == []
    (out / "a" / "f.txt").symlink_to(outside / "f.txt")  # a link as the target is replaced
    atomic_write_bytes(out / "a" / "f.txt", b"y", within=out)
    assert (out / "a" / "f.txt").read_bytes() == b"y" and not (out / "a" / "f.txt").is_symlink()
    assert list(outside.iterdir()) == []


def test_render_sums_is_sorted_sha256sum_format(tmp_path: Path) -> None:
    text = render_sums({"z/b.txt": B, "a.txt": A})
    assert text == f"{A}  a.txt\n{B}  z/b.txt\n"
    with pytest.raises(ValueError, match="not a sha256"):
        render_sums({"a.txt": "xyz"})
    with pytest.raises(ValueError, match="cannot list"):
        render_sums({"../a.txt": A})


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils sha256sum")
def test_sha256sum_accepts_what_we_write(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "a.txt").write_bytes(b"a")
    (tmp_path / "d" / "b.txt").write_bytes(b"b")
    sums = {rel: sha256_file(tmp_path / rel) for rel in ("a.txt", "d/b.txt")}
    (tmp_path / "SHA256SUMS").write_text(render_sums(sums))
    done = subprocess.run(
        ["sha256sum", "--strict", "-c", "SHA256SUMS"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    "text, problem",
    [
        (f"{A}  a.txt", "does not end with a newline"),
        (f"{A} a.txt\n", "line 1 is not"),
        (f"{A[:-1]}  a.txt\n", "line 1 is not"),
        (f"{A}  /etc/passwd\n", "outside the bundle"),
        (f"{A}  ../a.txt\n", "outside the bundle"),
        (f"{A}  a.txt\n{B}  a.txt\n", "a second time"),
        (f"{B}  z.txt\n{A}  a.txt\n", "canonical form"),
        (f"{A} *a.txt\n", "canonical form"),
    ],
)
def test_parse_sums_reports_what_is_wrong(text: str, problem: str) -> None:
    parsed = parse_sums(text)
    assert any(problem in p for p in parsed.problems), parsed.problems


def test_parse_sums_round_trips() -> None:
    sums = {"a.txt": A, "d/b.txt": B}
    parsed = parse_sums(render_sums(sums))
    assert parsed.entries == sums and parsed.problems == ()


def test_walk_lists_files_and_links_without_following(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    (tmp_path / "link-to-dir").symlink_to(tmp_path / "d")
    (tmp_path / "link-to-file").symlink_to(tmp_path / "d" / "f")
    found = [(e.relpath, e.kind) for e in walk(tmp_path)]
    assert found == [("d/f", "file"), ("link-to-dir", "symlink"), ("link-to-file", "symlink")]


@pytest.mark.parametrize("mode", [0o000, 0o300], ids=["000", "wx"])
def test_walk_names_a_folder_it_cannot_list_instead_of_skipping_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    hold_to_modes(monkeypatch, tmp_path)
    out = tmp_path / "out"
    (out / "d" / "locked").mkdir(parents=True)
    (out / "d" / "f").write_text("x")
    (out / "d" / "locked" / "hidden").write_text("y")
    lock(out / "d" / "locked", mode)
    found = [(e.relpath, e.kind) for e in walk(out)]
    assert found == [("d/f", "file"), ("d/locked", "unreadable")]


def test_walk_of_a_folder_that_is_not_there_finds_nothing(tmp_path: Path) -> None:
    assert list(walk(tmp_path / "absent")) == []
