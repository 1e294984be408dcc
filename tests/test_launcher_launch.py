"""launch(): the overall timeout ends the whole tree, and nothing a launch started survives it.

A stand-in for torchrun (a small Python script) starts a child in a new session, as torchrun's
agent does with its ranks, so a plain killpg would miss it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _support.fake_agent import AGENT, fake_plan

from harness.launch import launcher as launcher_module
from harness.launch.launcher import launch
from harness.launch.proctree import (
    Proc,
    Tracker,
    alive,
    descendants,
    end_launch_root,
    identify,
    start_launch_root,
)
from harness.launch.progress import snapshot
from harness.launch.rankview import RecordReader
from harness.schema.rank_record import RankRecord, rank_record_path


def wait_for(path: Path) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_overall_timeout_ends_the_whole_tree(tmp_path):
    plan, pidfile = fake_plan(tmp_path, "hang", timeout_s=3)
    ticks: list[float] = []
    started = time.monotonic()
    result = launch(plan, tick=ticks.append, tick_s=0.1)
    child = wait_for(pidfile)
    assert result.timed_out
    assert result.exit_code != 0
    assert time.monotonic() - started < 30
    assert ticks and ticks[-1] >= 3
    assert identify(child) is None, "the agent's child (a rank) survived the timeout"
    assert plan.agent_log.exists()


def test_supervision_walks_the_tree_and_parses_a_record_only_as_often_as_it_must(
    tmp_path, monkeypatch
):
    """Many ticks, few walks of /proc, and an unchanged record parsed once."""
    plan, _pidfile = fake_plan(tmp_path, "exit", timeout_s=60)  # the agent lives about 1 s
    records = plan.out_dir / "records"
    records.mkdir(parents=True)
    RankRecord(rank=0, world_size=2, current_test="t.py::test_x").write(
        rank_record_path(records, 0)
    )
    walks: list[float] = []
    walk = Tracker.scan
    monkeypatch.setattr(Tracker, "scan", lambda self: walks.append(time.monotonic()) or walk(self))
    reader = RecordReader(records, world_size=2)
    ticks: list[float] = []

    def tick(elapsed_s: float) -> None:
        assert snapshot(reader, elapsed_s).current == "t.py::test_x"
        ticks.append(time.monotonic())

    result = launch(plan, tick=tick, tick_s=0.05, reader=reader)
    assert result.exit_code == 0 and len(ticks) >= 5
    while_ticking = [t for t in walks if t <= ticks[-1]]
    assert len(while_ticking) <= 1 + result.elapsed_s / launcher_module.SCAN_S, (walks, ticks)
    assert reader.parsed == 1


def test_processes_left_behind_by_a_finished_agent_are_ended_and_reported(tmp_path):
    plan, pidfile = fake_plan(tmp_path, "exit", timeout_s=60)
    result = launch(plan, tick_s=0.05)
    child = int(pidfile.read_text())
    assert not result.timed_out and result.exit_code == 0
    assert identify(child) is None
    assert child in result.leftovers


def test_tracker_sees_grandchildren_and_ignores_recycled_pids(tmp_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(tmp_path / "pid"), "hang"], start_new_session=True
    )
    try:
        child = wait_for(tmp_path / "pid")
        tracker = Tracker(parent.pid)
        tracker.scan()
        assert child in {p.pid for p in descendants(parent.pid)}
        assert child in {p.pid for p in tracker.survivors()}
        me = identify(child)
        assert me is not None and alive(me)
        assert not alive(Proc(child, me.create_time + 1))  # same pid, another process
        tracker.end_all(grace_s=2)
        assert tracker.survivors() == []
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="needs the main thread"
)
def test_sigterm_to_the_launcher_ends_the_tree_and_interrupts(tmp_path):
    plan, pidfile = fake_plan(tmp_path, "hang", timeout_s=120)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    result = launch(plan, tick_s=0.1)  # the interruption is a value for the bundle, not raised
    assert result.interrupted is not None and result.interrupted.signal == "SIGTERM"
    assert result.interrupted.exit_code == 128 + signal.SIGTERM
    assert identify(wait_for(pidfile)) is None
    assert {sig: signal.getsignal(sig) for sig in before} == before  # restored


LAUNCHER = """
import sys
from dataclasses import replace
from pathlib import Path
from harness.launch.launcher import launch
from harness.launch.progress import snapshot
from harness.launch.rankview import RecordReader
import pytest

from harness.launch.plan import RunOptions, build_plan
out = Path(sys.argv[1])
plan = build_plan(RunOptions(nproc_per_node=2), out)
launch(replace(plan, argv=(sys.executable, sys.argv[2], sys.argv[3], "hang")))
"""


def test_a_killed_launcher_takes_torchrun_down_with_it(tmp_path):
    _, pidfile = fake_plan(tmp_path, "hang", timeout_s=120)
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            LAUNCHER,
            str(tmp_path / "o"),
            str(tmp_path / "agent.py"),
            str(pidfile),
        ]
    )
    try:
        wait_for(pidfile)
        agent = next(p for p in descendants(launcher.pid) if p.pid != int(pidfile.read_text()))
        launcher.kill()  # SIGKILL: no cleanup code of the launcher runs
        launcher.wait()
        deadline = time.monotonic() + 20
        while alive(agent) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(agent), "torchrun outlived a SIGKILLed launcher"
    finally:
        launcher.kill()
        Tracker(os.getpid()).scan()
        child = identify(int(pidfile.read_text())) if pidfile.exists() else None
        if child is not None:
            os.kill(child.pid, signal.SIGKILL)


def test_an_adopting_tracker_never_takes_another_launchs_agent_for_an_orphan():
    """One process driving two nodes' launches: node 1's torchrun is a new child of the shared
    launcher, as an adopted orphan would be; ending it as node 0's leftover killed node 1."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    own = start_launch_root(lambda: subprocess.Popen(sleeper))
    tracker = Tracker(own.pid, adopter=os.getpid())
    other = start_launch_root(lambda: subprocess.Popen(sleeper))
    stray = subprocess.Popen(sleeper)  # a new child that is no launch's agent: adopted
    try:
        tracker.scan()
        seen = {p.pid for p in tracker.seen}
        assert other.pid not in seen
        assert stray.pid in seen and own.pid in seen
    finally:
        for proc in (own, other, stray):
            end_launch_root(proc.pid)
            proc.kill()
            proc.wait()
