"""launch() ends everything a run started, however it ends: a daemon a rank double-forked into
its own session between two scans, a helper that ignores SIGTERM when ^C comes twice, and a rank
that left mid-suite while its peers wait for it. Each protection is also removed, to show the
check then fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from harness.launch import ending
from harness.launch.launcher import launch
from harness.launch.plan import RunOptions, build_plan
from harness.launch.proctree import identify
from harness.schema.rank_record import RankRecord, rank_record_path

main_thread_only = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="needs the main thread"
)

# An agent whose child double-forks a daemon into a new session and exits at once, then the
# agent exits too: with the launcher scanning every 30 s, no scan ever sees the daemon.
DOUBLE_FORK = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
        os.rename(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(600)
    os._exit(0)
os.wait()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""

# An agent whose child ignores SIGTERM (a helper that only SIGKILL ends); the agent hangs.
STUBBORN = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(600)
"""

# An agent with one "rank" that writes an incomplete record, then exits 0 mid-suite, and one
# that waits forever for it (a peer in a collective).
EARLY_EXIT = """
import json, os, subprocess, sys, time
records = sys.argv[2]
code = (
    "import json, os, sys, time\\n"
    "from harness.schema.rank_record import RankRecord, rank_record_path\\n"
    "from pathlib import Path\\n"
    "rank = int(sys.argv[1])\\n"
    "rec = RankRecord(rank=rank, world_size=2, pid=os.getpid(), current_test='t.py::test_x')\\n"
    "rec.write(rank_record_path(Path(sys.argv[2]), rank))\\n"
    "time.sleep(2.0 if rank == 1 else 600)\\n"
)
ranks = [subprocess.Popen([sys.executable, "-c", code, str(r), records]) for r in (0, 1)]
open(sys.argv[1], "w").write(str(ranks[0].pid))
time.sleep(600)
"""


def plan_for(tmp_path: Path, agent: str, timeout_s: float = 120.0):
    options = RunOptions(nproc_per_node=2, timeout_s=timeout_s, test_timeout_s=timeout_s / 2)
    plan = build_plan(options, tmp_path / "out")
    script = tmp_path / "agent.py"
    script.write_text(agent)
    pidfile = tmp_path / "child.pid"
    records = plan.out_dir / "records"
    records.mkdir(parents=True, exist_ok=True)
    argv = (sys.executable, str(script), str(pidfile), str(records))
    return replace(plan, argv=argv), pidfile


def wait_for(path: Path, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_a_double_forked_daemon_no_scan_saw_is_adopted_ended_and_reported(tmp_path):
    plan, pidfile = plan_for(tmp_path, DOUBLE_FORK)
    result = launch(plan, tick_s=30.0)
    daemon = wait_for(pidfile)
    try:
        assert result.exit_code == 0 and result.interrupted is None
        assert identify(daemon) is None, "the double-forked daemon outlived the run"
        assert daemon in result.leftovers, result.leftovers
    finally:
        kill(daemon)


def test_the_runs_cgroup_alone_catches_the_double_forked_daemon(tmp_path, monkeypatch):
    probe = ending.Cgroup.create()
    if probe is None:
        pytest.skip("no writable cgroup v2 hierarchy here: the subreaper is the containment")
    probe.remove()
    monkeypatch.setattr(ending, "set_subreaper", lambda on: False)
    plan, pidfile = plan_for(tmp_path, DOUBLE_FORK)
    result = launch(plan, tick_s=30.0)
    daemon = wait_for(pidfile)
    try:
        assert identify(daemon) is None and daemon in result.leftovers, result.leftovers
    finally:
        kill(daemon)


def test_without_subreaper_and_cgroup_the_environment_witness_still_ends_the_daemon(
    tmp_path, monkeypatch
):
    """The third witness alone: the daemon's environment holds the run's plan."""
    monkeypatch.setattr(ending, "set_subreaper", lambda on: False)
    monkeypatch.setattr(ending.Cgroup, "create", classmethod(lambda cls: None))
    plan, pidfile = plan_for(tmp_path, DOUBLE_FORK)
    result = launch(plan, tick_s=30.0)
    daemon = wait_for(pidfile)
    try:
        assert daemon in result.leftovers and identify(daemon) is None
    finally:
        kill(daemon)


def test_without_subreaper_cgroup_and_witness_the_double_forked_daemon_escapes(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(ending, "set_subreaper", lambda on: False)
    monkeypatch.setattr(ending.Cgroup, "create", classmethod(lambda cls: None))
    monkeypatch.setattr(ending.EnvironmentWitness, "find", lambda self: set())
    plan, pidfile = plan_for(tmp_path, DOUBLE_FORK)
    result = launch(plan, tick_s=30.0)
    daemon = wait_for(pidfile)
    try:
        assert identify(daemon) is not None and daemon not in result.leftovers
    finally:
        kill(daemon)


def _interrupt_twice() -> threading.Thread:
    def send() -> None:
        time.sleep(1.5)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1.0)  # inside the 5 s grace the first ^C started
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@main_thread_only
def test_a_second_interrupt_hurries_the_ending_and_still_ends_everything(tmp_path):
    plan, pidfile = plan_for(tmp_path, STUBBORN)
    sender = _interrupt_twice()
    started = time.monotonic()
    result = launch(plan, tick_s=0.1)
    sender.join()
    helper = wait_for(pidfile)
    try:
        assert result.interrupted is not None and result.interrupted.signal == "SIGINT"
        assert result.interrupted.exit_code == 130
        assert identify(helper) is None, "the helper that ignores SIGTERM survived"
        assert time.monotonic() - started < 1.5 + 5.0, "the second ^C did not skip the grace"
    finally:
        kill(helper)


@main_thread_only
@pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")  # the orphan
def test_handlers_that_raise_at_every_interrupt_orphan_the_helper(tmp_path, monkeypatch):
    """The negative control: raising again at the second ^C (as Python's own handler would)
    aborts the ending before it killed the helper that ignores SIGTERM."""

    def raise_every_time(self: ending.Hold, signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ending.Hold, "_on_signal", raise_every_time)
    # The run's cgroup is a second line that would still end the helper; this is about the first.
    monkeypatch.setattr(ending.Cgroup, "create", classmethod(lambda cls: None))
    plan, pidfile = plan_for(tmp_path, STUBBORN)
    sender = _interrupt_twice()
    with pytest.raises(KeyboardInterrupt):
        launch(plan, tick_s=0.1)
    sender.join()
    helper = wait_for(pidfile)
    try:
        assert identify(helper) is not None, "the check above could not fail"
    finally:
        kill(helper)


def test_a_rank_that_exits_mid_suite_ends_the_tree_within_seconds(tmp_path):
    plan, pidfile = plan_for(tmp_path, EARLY_EXIT, timeout_s=120)
    result = launch(plan, tick_s=0.2)
    waiting_peer = wait_for(pidfile)
    path = rank_record_path(plan.out_dir / "records", 1)
    since_it_left = time.time() - path.stat().st_mtime - 2.0  # it wrote, slept 2 s, exited
    assert result.ended_for_ranks_gone_mid_suite == [1] and not result.timed_out
    assert since_it_left < ending.DEAD_RANK_GRACE_S + 10, f"took {since_it_left:.1f}s"
    assert identify(waiting_peer) is None
    rec = RankRecord.read(path)
    assert not rec.complete and rec.abort_reason is None


def test_without_the_watch_a_rank_gone_mid_suite_is_waited_for(tmp_path, monkeypatch):
    monkeypatch.setattr(ending.DeadRankWatch, "overdue", lambda self, now=None: [])
    plan, _pidfile = plan_for(tmp_path, EARLY_EXIT, timeout_s=8)
    result = launch(plan, tick_s=0.2)
    # only the whole-run timeout ended it
    assert result.timed_out and result.ended_for_ranks_gone_mid_suite == []
