"""The wheel carries the qualification suites as `harness/suites`, so an installed `dcpqual run`
runs them without a checkout (`harness.core.suites`). Everything else is in pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithSuites(build_py):
    """build_py, then suites/ (its .py files: tests and conftests) into harness/suites."""

    def run(self) -> None:
        super().run()
        source = HERE / "suites"
        target = Path(self.build_lib) / "harness" / "suites"
        for path in sorted(source.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            dest = target / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)


setup(cmdclass={"build_py": BuildWithSuites})
