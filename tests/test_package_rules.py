"""Which harness packages may import which: the rank side stays self-contained (like
pytest-xdist's worker), the vendored warm code imports nothing above the vocabulary, the
vocabulary and the formats are torch-free, and the evidence package
turns an out folder into a bundle without the launcher or the image package.

Read from the source (every `import` and `from ... import`, also inside functions), so a lazy
import cannot hide an edge."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parent.parent / "harness"
# Torch-free single modules every package may use (atomic writes, the JSON reader, errors, git,
# the pidfd).
FOUNDATION = (
    "harness.atomic",
    "harness.jsonfile",
    "harness.errors",
    "harness.gitinfo",
    "harness.pidfd",
)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, absolute names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def harness_imports(package: str) -> dict[str, set[str]]:
    """{file: harness modules it imports} for every file of `package`."""
    files = sorted((HARNESS / package).rglob("*.py"))
    assert files, f"harness/{package} has no modules"
    return {
        str(f.relative_to(HARNESS.parent)): {m for m in imports_of(f) if m.startswith("harness.")}
        for f in files
    }


def within(module: str, allowed: tuple[str, ...]) -> bool:
    return any(module == a or module.startswith(f"{a}.") for a in allowed)


def violations(package: str, allowed: tuple[str, ...]) -> list[str]:
    return [
        f"{file} imports {module}"
        for file, modules in harness_imports(package).items()
        for module in sorted(modules)
        if not within(module, allowed)
    ]


@pytest.mark.parametrize(
    "package, allowed",
    [
        ("rank", ("harness.rank", "harness.core", "harness.schema", *FOUNDATION)),
        ("schema", ("harness.schema", "harness.core", *FOUNDATION)),
        ("core", ("harness.core", *FOUNDATION)),
        # The vendored warm code under test: it stands where production's warm stands, so it
        # reaches nothing of the harness that qualifies it.
        ("warm", ("harness.warm", "harness.core", "harness.schema", *FOUNDATION)),
    ],
)
def test_a_package_imports_only_what_its_role_allows(package: str, allowed: tuple) -> None:
    assert violations(package, allowed) == []


def test_the_evidence_package_imports_no_launch_or_image_module() -> None:
    bad = [
        f"{file} imports {module}"
        for file, modules in harness_imports("evidence").items()
        for module in sorted(modules)
        if within(module, ("harness.launch", "harness.image"))
    ]
    assert bad == []


def test_the_rule_sees_lazy_imports_and_fires_on_a_forbidden_one(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from harness.schema import base\n"
        "def f():\n"
        "    from harness.transport.registry import transports_used\n"
        "    import harness.launch.plan\n"
    )
    found = {m for m in imports_of(module) if m.startswith("harness.")}
    assert {"harness.transport.registry", "harness.launch.plan"} <= found
    assert not all(within(m, ("harness.rank", "harness.schema")) for m in found)
