"""tools/gpu-smoke.sh and tools/gpu-smoke-wheels.sh: the one command for a GPU machine without
network, and the wheels it carries."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "tools" / "gpu-smoke.sh"
WHEELS = REPO / "tools" / "gpu-smoke-wheels.sh"


def test_without_cuda_the_script_exits_2_and_leaves_no_bundle(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "OUT": str(tmp_path),
        "CUDA_VISIBLE_DEVICES": "",
        "GPU_SMOKE_SITE": str(tmp_path / "site"),
    }
    done = subprocess.run(
        ["bash", str(SMOKE)], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "dcpqual gpu-smoke: error: no CUDA device" in done.stdout
    assert not (tmp_path / "gpu-smoke").exists()
    assert (tmp_path / "gpu-smoke.log").read_text().count("\n") == 1


def _listed() -> set[str]:
    text = WHEELS.read_text()
    pure = re.search(r"^pure=\((.*)\)$", text, re.MULTILINE)
    assert pure is not None
    return {*pure.group(1).split(), "pydantic-core"}


def _name(requirement: str) -> str:
    return re.split(r"[ ;<>=!~\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_carried_wheels_cover_what_pydantic_and_junitparser_need() -> None:
    """A GPU machine without network gets only what this list names (pip runs --no-deps)."""
    listed = _listed()
    for top in ("pydantic", "junitparser", "pydantic-core", "typing-inspection"):
        assert top in listed
        for requirement in requires(top) or []:
            if "extra ==" in requirement:
                continue
            assert _name(requirement) in listed, f"{top} needs {requirement}"


def test_the_wheels_are_never_committed() -> None:
    assert "/tools/wheels/" in (REPO / ".gitignore").read_text().splitlines()
