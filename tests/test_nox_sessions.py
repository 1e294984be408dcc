"""The GPU nox sessions, run with a recording session: what they install and run, in order.

`nox -s gpu16` used to install torch for half a minute before `dcpqual image build` said the
lock was not pinned; cpu16 handed its posargs to `dcpqual run` and gpu16 to pytest.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from _support.noxfile import load_noxfile

REPO = Path(__file__).resolve().parent.parent


class Refused(Exception):
    pass


class RecordingSession:
    """Just enough of nox.Session: installs and runs are recorded; `python -m harness lock
    check` really runs (from this checkout), as the session would run it."""

    def __init__(self, posargs: list[str]) -> None:
        self.posargs = posargs
        self.calls: list[tuple[str, ...]] = []

    def install(self, *args: str, **kwargs: object) -> None:
        self.calls.append(("install", *args))

    def run(self, *args: str, env: dict[str, str] | None = None, **kwargs: object) -> None:
        self.calls.append(("run", *args))
        if args[:4] == ("python", "-m", "harness", "lock"):
            proc = subprocess.run(
                [sys.executable, *args[1:]], cwd=REPO, env={**(env or {})}, check=False
            )
            if proc.returncode:
                raise Refused(" ".join(args))

    def log(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def noxfile() -> ModuleType:
    return load_noxfile()


def installs_torch(calls: list[tuple[str, ...]]) -> bool:
    return any(c[0] == "install" and any(a.startswith("torch") for a in c[1:]) for c in calls)


@pytest.mark.parametrize("name", ["image", "gpu16"])
def test_an_unpinned_lock_is_refused_before_torch_is_installed(noxfile, name):
    session = RecordingSession([])
    with pytest.raises(Refused, match="lock check"):
        getattr(noxfile, name)(session)
    assert not installs_torch(session.calls), session.calls


def test_the_lock_check_comes_before_the_torch_install(noxfile, monkeypatch):
    session = RecordingSession(["--no-image"])
    monkeypatch.setattr(RecordingSession, "run", lambda self, *a, **k: self.calls.append(a))
    noxfile.gpu16(session)
    check = next(i for i, c in enumerate(session.calls) if "lock" in c)
    torch = next(i for i, c in enumerate(session.calls) if installs_torch([c]))
    assert check < torch


def test_nightly_without_the_image_needs_no_lock(noxfile, monkeypatch):
    session = RecordingSession(["--archive", "a", "--no-image"])
    monkeypatch.setattr(RecordingSession, "run", lambda self, *a, **k: self.calls.append(a))
    noxfile.nightly(session)
    assert not any("lock" in c for c in session.calls)


def test_cpu16_and_gpu16_hand_their_posargs_to_the_dcpqual_command_alike(noxfile, monkeypatch):
    """Both: dcpqual's options, then pytest's after a second `--`."""
    posargs = ["--", "-k", "warmup"]
    ran: dict[str, tuple[str, ...]] = {}
    for name in ("cpu16", "gpu16_host"):
        session = RecordingSession(list(posargs))
        monkeypatch.setattr(RecordingSession, "run", lambda self, *a, **k: self.calls.append(a))
        monkeypatch.setattr(RecordingSession, "error", lambda self, *a: None, raising=False)
        getattr(noxfile, name)(session)
        ran[name] = next(c for c in session.calls if c[:1] == ("dcpqual",))
    assert ran["cpu16"][-3:] == ("--", "-k", "warmup")
    assert ran["gpu16_host"] == ("dcpqual", "gpu16", "--no-image", "--", "-k", "warmup")


def test_the_unit_suite_keeps_a_bytecode_cache_of_its_own_in_its_virtualenv(
    noxfile: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written also where the environment says PYTHONDONTWRITEBYTECODE, never into the checkout."""
    from nox.virtualenv import VirtualEnv

    envs: dict[tuple[str, ...], dict[str, str] | None] = {}
    monkeypatch.setattr(
        RecordingSession, "run", lambda self, *a, env=None, **k: envs.update({a: env})
    )
    session = RecordingSession([])
    session.virtualenv = VirtualEnv(str(tmp_path / "venv"))  # type: ignore[attr-defined]
    noxfile.tests(session)
    [(command, env)] = envs.items()
    assert command[0] == "pytest"
    cache = str(tmp_path / "venv" / "pycache")
    assert env == {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": cache}
    session.virtualenv = object()  # no virtualenv of its own (--no-venv): the environment as is
    noxfile.tests(session)
    assert envs[command] == {}
