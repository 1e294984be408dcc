"""The controller's light paths need no torch: `dcpqual --help` imports none, and `dcpqual verify`
checks a bundle where torch cannot be imported at all (a reviewer's machine with only the
harness's light dependencies)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _support.evidence_factory import failing_run, passing_run

from harness.evidence.writer import finalize_bundle

# Packages a light venv lacks: torch and what only the ranks and the real trees use.
HEAVY = ("torch", "numpy", "vllm", "b12x", "triton")

BLOCKER = f"""
import importlib.abc
import sys

HEAVY = {HEAVY!r}


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None


sys.meta_path.insert(0, Blocker())
"""


def imported_modules(importtime_stderr: str) -> set[str]:
    """Module names from `python -X importtime` lines (`import time: self | cumulative | name`)."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            names.add(line.rsplit("|", 1)[1].strip())
    names.discard("package")  # the header line
    return names


def test_help_imports_no_torch(repo_root: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "harness", "--help"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "verify" in proc.stdout
    names = imported_modules(proc.stderr)
    assert "harness.cli" in names, "importtime output not understood"
    assert sorted(n for n in names if n.split(".")[0] in HEAVY) == []


def test_importtime_parsing_sees_torch_when_it_is_imported() -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import torch"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "torch" in imported_modules(proc.stderr)


@pytest.fixture
def light_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import torch (nor the other heavy packages)."""
    site = tmp_path / "light-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


def _verify(bundle: Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "verify", str(bundle)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_light_environment_really_has_no_torch(light_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import torch"], env=light_env, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "blocked" in proc.stderr


def test_verify_works_without_torch(
    tmp_path: Path, light_env: dict[str, str], repo_root: Path
) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    finalize_bundle(good, passing_run(good, world=2))
    finalize_bundle(bad, failing_run(bad, world=2, bad_rank=1))
    (bad / "records" / "rank-01.json").write_text("{}")  # an edit the hashes catch

    proc = _verify(good, light_env, repo_root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _verify(bad, light_env, repo_root)
    assert proc.returncode == 1, proc.stdout + proc.stderr


def test_verify_imports_no_torch_where_torch_is_installed(tmp_path: Path, repo_root: Path) -> None:
    """Working without torch is not enough: an import of torch guarded by `except ImportError`
    would pass the light environment and still cost every verify torch's import here."""
    bundle = tmp_path / "good"
    finalize_bundle(bundle, passing_run(bundle, world=2))
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "harness", "verify", str(bundle)],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    names = imported_modules(proc.stderr)
    assert "harness.evidence.verify" in names, "importtime output not understood"
    assert sorted(n for n in names if n.split(".")[0] in HEAVY) == []


# `dcpqual run` up to the point where it would start torchrun, with the launch replaced by a
# line that names the heavy packages imported by then: the checks of its options need none.
UNTIL_LAUNCH = f"""
import sys
import harness.launch.launcher as launcher
from harness.cli import main
def launch(options):
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
    print("would launch", options.warm_impl, "with", heavy)
    return 0
launcher.run = launch
raise SystemExit(main(["run", "--nproc-per-node", "2", *sys.argv[1:]]))
"""


def _until_launch(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", UNTIL_LAUNCH, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("warm_impl", ["vendored", "before-kimi"])
def test_run_checks_its_options_without_importing_torch(warm_impl: str, repo_root: Path) -> None:
    """Torch is importable here: what is pinned is that the launcher does not import it."""
    proc = _until_launch(["--warm-impl", warm_impl], repo_root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"would launch {warm_impl} with []"


def test_run_refuses_a_tp_the_stand_ins_cannot_split_without_torch(
    light_env: dict[str, str], repo_root: Path
) -> None:
    proc = _until_launch(["--tp", "100", "--dcp", "1"], repo_root, light_env)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.splitlines() == [
        "dcpqual run: error: kimi-k3 has 96 attention heads: at tp=100 (1 per rank) a whole "
        "rank would hold only padding heads; the suites build every stand-in model at --tp"
    ]


def test_the_torch_free_choices_name_what_the_builders_build() -> None:
    from harness.core import choices
    from harness.core.signature import OUTPUT_DTYPES
    from harness.models import backends, builders, warm_impls
    from harness.transport.dtypes import MODEL_DTYPES
    from harness.warm import recognizers

    assert (*builders.FAMILIES, "mixed") == choices.MODEL_CHOICES
    assert {k: f.num_heads for k, f in builders.FAMILIES.items()} == choices.FAMILY_HEADS
    assert tuple(warm_impls.BUILTIN_IMPLS) == choices.WARM_IMPL_NAMES
    for name in choices.ATTENTION_BACKENDS:
        for family in builders.FAMILIES:
            assert backends.backend_for(family, name).get_name()
    assert set(recognizers.RECOGNIZER_SETS) == set(choices.RECOGNIZER_SET_NAMES)
    assert set(MODEL_DTYPES) == set(OUTPUT_DTYPES)


def test_the_launchers_real_tree_heads_are_the_tiny_configs() -> None:
    from harness.launch.plan import REAL_MODEL_HEADS, REAL_MODELS
    from harness.models.real import configs

    assert tuple(REAL_MODEL_HEADS) == REAL_MODELS
    assert REAL_MODEL_HEADS == {
        "kimi-k3": configs.KIMI_HEADS,
        "deepseek-v3": configs.DEEPSEEK_V3_HEADS,
    }
