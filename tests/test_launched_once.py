"""`_support.runs.launched_once`: a launch several test files read is made once per pytest
session, however many xdist workers run its readers, and never read from another session."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from _support.runs import Launched, launched_once


class Recorder:
    """A stand-in launch: records each call, takes `seconds`, and raises on the first where
    asked to."""

    def __init__(self, *, raise_first: bool = False, seconds: float = 0.0) -> None:
        self.folders: list[Path] = []
        self.raise_first = raise_first
        self.seconds = seconds

    def __call__(self, folder: Path) -> Launched:
        self.folders.append(folder)
        time.sleep(self.seconds)
        (folder / "bundle").mkdir()
        if self.raise_first and len(self.folders) == 1:
            raise RuntimeError("the launch broke")
        return Launched((1,), folder / "bundle", f"launch {len(self.folders)}")


class Worker:
    """What `launched_once` asks of pytest's `tmp_path_factory`, for one xdist worker whose
    temporary folder lies in `session` (this test's own, beside its other workers')."""

    def __init__(self, session: Path, name: str) -> None:
        self.base = session / name

    def getbasetemp(self) -> Path:
        self.base.mkdir(parents=True, exist_ok=True)
        return self.base

    def mktemp(self, name: str) -> Path:
        folder = self.getbasetemp() / f"{name}-{uuid.uuid4().hex[:8]}"
        folder.mkdir()
        return folder


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> str:
    """A pytest-xdist session id of this test's own, as xdist sets it in each worker."""
    run_id = uuid.uuid4().hex
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run_id)
    return run_id


@pytest.fixture
def workers(tmp_path: Path) -> tuple[Any, Any]:
    """Two workers of one session."""
    return Worker(tmp_path, "popen-gw0"), Worker(tmp_path, "popen-gw1")


def test_the_second_worker_reads_what_the_first_launched(
    workers: tuple[Any, Any], session: str
) -> None:
    launch = Recorder()
    first = launched_once(workers[0], "shared", launch)
    second = launched_once(workers[1], "shared", launch)
    assert len(launch.folders) == 1 and second == first
    assert first.out.is_dir() and first.printed == "launch 1"


def test_workers_asking_at_once_share_one_launch(workers: tuple[Any, Any], session: str) -> None:
    """The second waits on the lock while the first launches, then reads it."""
    launch = Recorder(seconds=0.5)
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda worker: launched_once(worker, "shared", launch), workers))
    assert len(launch.folders) == 1 and got[0] == got[1]


def test_another_session_launches_again(
    workers: tuple[Any, Any], session: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --basetemp folder outlives its session: the next one must not read its launches."""
    launch = Recorder()
    launched_once(workers[0], "shared", launch)
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", uuid.uuid4().hex)
    launched_once(workers[0], "shared", launch)
    assert len(launch.folders) == 2 and launch.folders[0] != launch.folders[1]


def test_a_launch_that_raised_is_made_again_by_the_next_reader(
    workers: tuple[Any, Any], session: str
) -> None:
    launch = Recorder(raise_first=True)
    with pytest.raises(RuntimeError):
        launched_once(workers[0], "shared", launch)
    again = launched_once(workers[1], "shared", launch)
    assert len(launch.folders) == 2 and again.printed == "launch 2"


def test_without_xdist_each_reader_launches_in_its_own_folder(
    workers: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    launch = Recorder()
    launched_once(workers[0], "shared", launch)
    launched_once(workers[0], "shared", launch)
    assert len(launch.folders) == 2 and launch.folders[0] != launch.folders[1]
