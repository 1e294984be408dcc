"""`_support.runs.launched_once`: a launch several test files read is made once per pytest
session, however many xdist workers run its readers, and never read from another session."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from _support.runs import Launched, launched_once


class Recorder:
    """A stand-in launch: records each call, and raises on the first where asked to."""

    def __init__(self, *, raise_first: bool = False) -> None:
        self.folders: list[Path] = []
        self.raise_first = raise_first

    def __call__(self, folder: Path) -> Launched:
        self.folders.append(folder)
        (folder / "bundle").mkdir()
        if self.raise_first and len(self.folders) == 1:
            raise RuntimeError("the launch broke")
        return Launched((1,), folder / "bundle", f"launch {len(self.folders)}")


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> str:
    """A pytest-xdist session id of this test's own, as xdist sets it in each worker."""
    run_id = uuid.uuid4().hex
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run_id)
    return run_id


def test_the_second_reader_reads_what_the_first_launched(
    tmp_path_factory: pytest.TempPathFactory, session: str
) -> None:
    launch = Recorder()
    first = launched_once(tmp_path_factory, "shared", launch)
    second = launched_once(tmp_path_factory, "shared", launch)
    assert len(launch.folders) == 1 and second == first
    assert first.out.is_dir() and first.printed == "launch 1"


def test_another_session_launches_again(
    tmp_path_factory: pytest.TempPathFactory, session: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = Recorder()
    launched_once(tmp_path_factory, "shared", launch)
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", uuid.uuid4().hex)
    launched_once(tmp_path_factory, "shared", launch)
    assert len(launch.folders) == 2 and launch.folders[0] != launch.folders[1]


def test_a_launch_that_raised_is_made_again_by_the_next_reader(
    tmp_path_factory: pytest.TempPathFactory, session: str
) -> None:
    launch = Recorder(raise_first=True)
    with pytest.raises(RuntimeError):
        launched_once(tmp_path_factory, "shared", launch)
    again = launched_once(tmp_path_factory, "shared", launch)
    assert len(launch.folders) == 2 and again.printed == "launch 2"


def test_without_xdist_each_reader_launches_in_its_own_folder(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    launch = Recorder()
    launched_once(tmp_path_factory, "shared", launch)
    launched_once(tmp_path_factory, "shared", launch)
    assert len(launch.folders) == 2 and launch.folders[0] != launch.folders[1]
