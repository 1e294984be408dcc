"""Shared test code lives in `tests/_support/` (helpers) or `conftest.py` (fixtures), never in a
test module another test module imports: importing a test module runs its collection-time code
and re-registers its tests' fixtures under another name."""

from __future__ import annotations

import ast
from pathlib import Path


def _test_module_names(tests: Path) -> set[str]:
    """Importable names of the test modules (and of loose modules beside them in tests/)."""
    names = {p.stem for p in tests.rglob("test_*.py")}
    names |= {p.stem for p in tests.glob("*.py") if p.name != "conftest.py"}
    return names


def imported_test_modules(source: str, test_modules: set[str]) -> list[str]:
    """The test modules that `source` imports, as `name` or `tests.name`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            modules = [node.module or alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            head = parts[1] if parts[0] == "tests" and len(parts) > 1 else parts[0]
            if head in test_modules:
                found.append(module)
    return found


def test_no_test_module_imports_another(repo_root: Path) -> None:
    tests = repo_root / "tests"
    names = _test_module_names(tests)
    offenders = {
        str(path.relative_to(repo_root)): hits
        for path in sorted(tests.rglob("*.py"))
        if (hits := imported_test_modules(path.read_text(), names))
    }
    assert offenders == {}, "move shared helpers to tests/_support/, fixtures to conftest.py"


def test_the_check_sees_every_spelling_of_a_test_module_import() -> None:
    names = {"test_evidence_factory", "gloo_spawn"}
    source = (
        "from test_evidence_factory import passing_run\n"
        "import gloo_spawn\n"
        "from tests.test_evidence_factory import context\n"
        "from . import test_evidence_factory\n"
        "from _support.evidence_factory import passing_run\n"
        "import harness.cli\n"
    )
    assert imported_test_modules(source, names) == [
        "test_evidence_factory",
        "gloo_spawn",
        "tests.test_evidence_factory",
        "test_evidence_factory",
    ]
