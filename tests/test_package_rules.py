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


def package_graph() -> dict[str, set[str]]:
    """{harness package or top-level module: the other ones it imports}, lazy imports too."""
    graph: dict[str, set[str]] = {}
    for path in HARNESS.rglob("*.py"):
        parts = path.relative_to(HARNESS).parts
        source = parts[0] if len(parts) > 1 else path.stem
        targets = {m.split(".")[1] for m in imports_of(path) if m.startswith("harness.")}
        graph.setdefault(source, set()).update(targets - {source})
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of `graph` once, as the path that closes it (depth-first)."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            circle = path[path.index(node) :]
            if sorted(circle) not in [sorted(c) for c in found]:
                found.append([*circle, node])
            return
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            visit(target, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def test_no_harness_package_imports_one_that_imports_it_back() -> None:
    """The launcher may use the models and the engine lane, not the other way round: a circle
    makes every package in it a dependency of each other one."""
    assert circles(package_graph()) == []


def test_the_circle_rule_fires_on_a_circle_through_a_third_package() -> None:
    graph = {"launch": {"models"}, "models": {"engine"}, "engine": {"launch"}, "core": set()}
    assert circles(graph) == [["engine", "launch", "models", "engine"]]
    assert circles({"launch": {"models"}, "models": {"core"}}) == []
