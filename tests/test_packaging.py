"""What `pip install dcpqual` gives someone without the checkout: a wheel that carries the
suites (and an installed `dcpqual run` that finds them), a `pytest11` entry point for the rank
plugin that is inert outside torchrun, and torch as a range (the nox sessions pin it exactly)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from _support.noxfile import load_noxfile
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of this checkout's files (no network, no isolation)."""
    root = tmp_path_factory.mktemp("wheel")
    src, out = root / "src", root / "dist"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, files):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((REPO / rel).read_bytes())
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
         "-q", "-w", str(out)],
        cwd=src, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    [built] = out.glob("dcpqual-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel unpacked as site-packages would hold it (no checkout beside it)."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site


def test_the_wheel_carries_every_suite_file(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        shipped = {n.removeprefix("harness/suites/") for n in z.namelist()}
    in_checkout = {
        p.relative_to(REPO / "suites").as_posix() for p in (REPO / "suites").rglob("*.py")
    }
    assert in_checkout and in_checkout <= shipped


def test_the_wheel_declares_the_pytest11_entry_point(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        [name] = [n for n in z.namelist() if n.endswith("entry_points.txt")]
        text = z.read(name).decode()
    assert "[pytest11]\ndcpqual = harness.rank.entry" in text


def test_an_installed_run_finds_the_suites_in_the_package(installed: Path, tmp_path: Path) -> None:
    """`dcpqual run -- -k warmup` from an installed wheel, up to the plan it would launch."""
    code = (
        "from pathlib import Path\n"
        "from harness.cli import main\n"
        "from harness.launch import launcher, plan\n"
        "launcher.run = lambda o: print(plan.build_plan(o, Path('/tmp/o')).targets) or 0\n"
        "raise SystemExit(main(['run', '--nproc-per-node', '2', '--', '-k', 'warmup']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(installed),
        "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    suites = installed / "harness" / "suites"
    assert done.stdout.strip() == str((str(suites), "-k", "warmup"))


def test_torch_is_a_range_and_the_sessions_install_the_exact_pin() -> None:
    [torch] = [
        Requirement(d) for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch")
    ]
    assert torch.specifier.contains("2.13.0") and torch.specifier.contains("2.13.1")
    assert not any(s.operator == "==" for s in torch.specifier)
    noxfile = load_noxfile()
    installs: list[tuple[str, ...]] = []
    session = SimpleNamespace(install=lambda *a, **k: installs.append(a))
    noxfile.install_harness(session, "dev")
    assert noxfile.TORCH_PIN == "torch==2.13.0"
    assert installs[0] == ("torch==2.13.0",)  # first, alone: the CPU wheel resolves here
    assert all("torch==2.13.0" in call for call in installs)  # and holds every later install
    # CI installs nothing but nox itself; the sessions install the harness (with the pin)
    installs_in_ci = [
        ln for ln in (REPO / ".ci" / "run").read_text().splitlines() if "pip install" in ln
    ]
    assert installs_in_ci and all(ln.rstrip().endswith('"nox>=2024.4"') for ln in installs_in_ci)


def test_the_entry_point_is_inert_outside_torchrun() -> None:
    """This repository's own tests, run with the entry point loaded as pytest would autoload
    it (autoloaded where this checkout is installed, else named with -p): they pass, warnings
    as errors."""
    from importlib.metadata import entry_points

    installed = any(ep.value == "harness.rank.entry" for ep in entry_points(group="pytest11"))
    load = [] if installed else ["-p", "harness.rank.entry"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *load, "-p", "no:cacheprovider",
         "-q", "tests/test_cli_small.py", "-k", "help", "-W", "error"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    assert "1 passed" in done.stdout


def test_the_entry_point_registers_the_rank_plugin_under_torchrun(monkeypatch) -> None:
    from harness.rank import entry

    registered: list[str] = []
    manager = SimpleNamespace(
        has_plugin=lambda name: False,
        register=lambda plugin, name: registered.append(name),
    )
    config = SimpleNamespace(pluginmanager=manager)
    monkeypatch.delenv("RANK", raising=False)
    entry.pytest_configure(config)  # type: ignore[arg-type]
    assert registered == []
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    entry.pytest_configure(config)  # type: ignore[arg-type]
    assert registered == ["harness.rank.plugin"]
    manager.has_plugin = lambda name: True  # named with -p already: not twice
    entry.pytest_configure(config)  # type: ignore[arg-type]
    assert registered == ["harness.rank.plugin"]
