"""No helper outlives a run, however it runs: real `dcpqual run` launches at 2 ranks whose
fault rank starts a helper that leaves its session and keeps re-forking (each incarnation
lives 5 ms), with the run's cgroup, with the helper moving itself out of it, and with no
writable cgroup at all (the documented fallback: the launcher as child subreaper)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from _support.runs import processes_of_run, receipt, run

from harness.cli import main
from harness.launch import ending
from harness.launch.proctree import identify

pytestmark = [pytest.mark.torchrun]


def _alive_incarnations(pidfile: Path) -> list[int]:
    pids = {int(p) for p in pidfile.read_text().split()} if pidfile.exists() else set()
    return sorted(p for p in pids if identify(p) is not None)


@pytest.mark.parametrize("where", ["cgroup", "escapes-cgroup", "no-cgroup"])
def test_a_reforking_helper_is_ended_reported_and_fails_the_run(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pidfile = tmp_path / "refork.pids"
    monkeypatch.setenv("DCPQUAL_REFORK_PIDS", str(pidfile))
    if where == "escapes-cgroup":
        monkeypatch.setenv("DCPQUAL_REFORK_ESCAPE", "1")
    if where == "no-cgroup":
        monkeypatch.setattr(ending.Cgroup, "create", classmethod(lambda cls: None))
    elif ending.Cgroup.create() is None:
        pytest.skip("no writable cgroup v2 here")
    out = tmp_path / "bundle"
    code, _ = run(out, 2, "rank_refork.py")
    time.sleep(0.5)  # a helper that outlived the run has forked again by now
    alive = _alive_incarnations(pidfile)
    try:
        assert alive == [], "the re-forking helper outlived the run"
        assert processes_of_run(out) == []
        data = receipt(out)
        assert data["run"]["extra"]["launch"]["leftovers"], "its ending was not reported"
        assert (code, data["verdict"]) == (1, "fail")
        assert any("still running after torchrun exited" in f for f in data["failures"])
        assert main(["verify", str(out)]) == 0
    finally:
        deadline = time.monotonic() + 5
        while (left := _alive_incarnations(pidfile)) and time.monotonic() < deadline:
            for pid in left:
                os.kill(pid, signal.SIGKILL)
