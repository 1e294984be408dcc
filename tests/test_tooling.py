"""The linters and the test runner see every file the repository tracks.

Default excludes of ruff and pytest (`dist`, `build`, ...) once hid a whole package from lint;
these checks make such a blind spot fail instead of passing quietly.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _tracked_python_files(repo_root: Path) -> set[str]:
    listed = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=repo_root, capture_output=True, text=True, check=True
    ).stdout.split()
    return {name for name in listed if (repo_root / name).is_file()}


def _ruff() -> list[str]:
    found = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(found).is_file():
        pytest.skip("ruff is not installed (the dev extra installs it)")
    return [found]


def test_ruff_checks_every_tracked_python_file(repo_root: Path) -> None:
    if not (repo_root / ".git").exists():
        pytest.skip("not a git checkout")
    shown = subprocess.run(
        [*_ruff(), "check", "--show-files", "."],
        cwd=repo_root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    linted = {str(Path(line).resolve().relative_to(repo_root)) for line in shown if line.strip()}
    missing = sorted(_tracked_python_files(repo_root) - linted)
    assert not missing, f"ruff does not lint {len(missing)} tracked file(s): {missing[:10]}"


def test_no_source_folder_has_a_name_the_tools_skip(repo_root: Path) -> None:
    """`dist` and `build` are in ruff's, pytest's and .gitignore templates' default excludes."""
    skipped = {"dist", "build", "node_modules", "venv", ".venv", "__pypackages__"}
    offending = sorted(
        name
        for name in _tracked_python_files(repo_root)
        if skipped.intersection(Path(name).parts[:-1])
    )
    assert not offending, f"tracked sources under a folder the tools skip: {offending}"
