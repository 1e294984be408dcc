"""launch() with forked ranks: the zygote's children are contained as torchrun's are (ended at
the timeout, found as leftovers after torchrun exits), the zygote itself is ended at the end and
is no stray, and a zygote that cannot start or dies is the launch's failure, in one line; one
that refuses to fork is not (the ranks start cold), and the state says whether it was used, why
not, and what the ranks' hash seeds were."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.launch.launcher import launch
from harness.launch.plan import RunOptions, ZygotePlan, build_plan
from harness.launch.proctree import identify
from harness.launch.zygote import ZygoteRun
from harness.rank.forkwire import refusal_path

# An agent that starts one stub per "rank" the way torchrun does (own session, the plan's env),
# writes the forked ranks' pids, then hangs ("hang") or exits at once leaving them ("leave").
AGENT = """
import json, os, subprocess, sys, time
out, mode = sys.argv[1], sys.argv[2]
stubs = [subprocess.Popen([sys.executable, "-m", "harness.rank.forkstub", "--", "-m", "sleeper",
                           out + f".{r}"], start_new_session=True, cwd=sys.argv[3]) for r in (0, 1)]
while not all(os.path.exists(out + f".{r}") for r in (0, 1)):
    time.sleep(0.02)
open(out + ".tmp", "w").write(json.dumps([int(open(out + f".{r}").read()) for r in (0, 1)]))
os.rename(out + ".tmp", out)
time.sleep(600 if mode == "hang" else 0)
"""

# A rank only SIGKILL ends: neither its stub's forwarded SIGTERM nor the launcher's.
SLEEPER = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def plan_for(tmp_path: Path, mode: str, timeout_s: float = 120.0, zygote_argv=None):
    options = RunOptions(nproc_per_node=2, timeout_s=timeout_s, test_timeout_s=timeout_s / 2)
    plan = build_plan(options, tmp_path / "out")
    assert plan.zygote is not None
    argv = zygote_argv or (*plan.zygote.argv, "json")  # the protocol needs no torch
    zygote = replace(plan.zygote, argv=tuple(argv))
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pids = tmp_path / "ranks.json"
    agent = (sys.executable, str(tmp_path / "agent.py"), str(pids), mode, str(tmp_path))
    return replace(plan, argv=agent, zygote=zygote), pids


def ranks_of(path: Path, timeout_s: float = 60.0) -> list[int]:
    import json

    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return list(json.loads(path.read_text()))


def gone(pid: int) -> bool:
    return identify(pid) is None


def kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def short_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks here ignore SIGTERM, so the launch waits out its whole SIGTERM grace before
    it SIGKILLs them: a short one proves the same containment sooner."""
    monkeypatch.setattr("harness.launch.launcher.SHUTDOWN_TIMEOUT_S", 1)


def test_the_timeout_ends_the_forked_ranks_and_the_zygote(tmp_path, short_shutdown):
    plan, pids = plan_for(tmp_path, "hang", timeout_s=8.0)
    result = launch(plan, tick_s=0.2)
    ranks = ranks_of(pids)
    try:
        assert result.timed_out
        assert all(gone(pid) for pid in ranks), "a forked rank outlived the timeout"
        assert result.zygote is not None and result.zygote.ready and result.zygote.error is None
        assert gone(result.zygote.pid)
        assert not plan.zygote.socket.exists()
    finally:
        kill(ranks)


def test_forked_ranks_left_after_torchrun_exits_are_ended_and_reported(tmp_path):
    plan, pids = plan_for(tmp_path, "leave")
    result = launch(plan, tick_s=0.2)
    ranks = ranks_of(pids)
    try:
        assert set(ranks) <= set(result.leftovers), result.leftovers
        assert all(gone(pid) for pid in ranks)
        assert result.zygote is not None and result.zygote.pid not in result.leftovers
        assert gone(result.zygote.pid) and result.zygote.error is None
    finally:
        kill(ranks)


def test_without_tracking_the_zygote_forked_ranks_escape_the_timeout(
    tmp_path, monkeypatch, short_shutdown
):
    """The negative control: a tracker that does not follow the zygote's children (and a zygote
    that leaves a rank whose stub is gone alone) ends torchrun and the stubs, but the ranks live
    on."""
    import harness.launch.proctree as proctree

    monkeypatch.setattr(proctree.Tracker, "scan", _scan_without_forker)
    monkeypatch.setattr("harness.launch.ending.set_subreaper", lambda on: False)
    monkeypatch.setattr("harness.launch.ending.Cgroup.create", classmethod(lambda cls: None))
    monkeypatch.setattr("harness.launch.ending.EnvironmentWitness.find", lambda self: set())
    plan, pids = plan_for(tmp_path, "hang", timeout_s=8.0)
    assert plan.zygote is not None
    lax = (
        "import sys, harness.rank.zygote as z; z.Zygote._kill = lambda self, rank: None; "
        "sys.exit(z.main(sys.argv[1:]))"
    )
    argv = (sys.executable, "-u", "-c", lax, str(plan.zygote.socket), "json")
    plan = replace(plan, zygote=replace(plan.zygote, argv=argv))
    result = launch(plan, tick_s=0.2)
    ranks = ranks_of(pids)
    try:
        assert result.timed_out
        assert [pid for pid in ranks if not gone(pid)], "expected the ranks to escape"
    finally:
        kill(ranks)


def _scan_without_forker(self) -> None:
    from harness.launch.proctree import descendants

    self.seen |= descendants(self.root)


def test_a_zygote_that_cannot_start_fails_the_launch_in_one_line(tmp_path):
    plan, _ = plan_for(tmp_path, "hang", zygote_argv=(str(tmp_path / "no-such-python"),))
    result = launch(plan, tick_s=0.2)
    assert result.exit_code == 1
    assert result.zygote is not None and result.zygote.error is not None
    assert "the rank zygote could not start" in result.zygote.error
    assert "\n" not in result.zygote.error
    assert not (plan.log_dir / "agent.log").exists(), "torchrun must not start without it"


def test_a_zygote_that_dies_mid_run_ends_the_tree_and_is_named(tmp_path):
    dies = (sys.executable, "-c", "import sys, time; print('preload failed: boom'); sys.exit(7)")
    plan, pids = plan_for(tmp_path, "hang", timeout_s=120.0, zygote_argv=dies)
    t0 = time.monotonic()
    result = launch(plan, tick_s=0.2)
    assert time.monotonic() - t0 < 60, "the launch waited past the zygote's death"
    assert result.zygote is not None and not result.zygote.ready
    error = result.zygote.error or ""
    assert "exited with 7" in error and "preload failed: boom" in error and "\n" not in error
    assert not pids.exists()  # no rank was ever forked


# An agent whose two stubs each run a rank that notes its pid and whether it was forked, then
# exits 0; the agent exits with the worst of their codes, as torchrun does.
AGENT_WAIT = """
import os, subprocess, sys
out = sys.argv[1]
stubs = [subprocess.Popen([sys.executable, "-u", "-m", "harness.rank.forkstub", "--", "-m",
                           "noter", out + f".{r}"], start_new_session=True, cwd=sys.argv[2])
         for r in (0, 1)]
sys.exit(max(s.wait() for s in stubs))
"""
NOTER = """
import os, sys
from harness.rank.parentage import parentage
open(sys.argv[1], "w").write(f"{os.getpid()} {parentage().forked}")
"""
THREADED = (
    "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
)


def waiting_plan(tmp_path: Path, preload: str) -> tuple[Any, Path]:
    plan, _ = plan_for(tmp_path, "hang")
    assert plan.zygote is not None
    (tmp_path / "agent_wait.py").write_text(AGENT_WAIT)
    (tmp_path / "noter.py").write_text(NOTER)
    (tmp_path / "threaded.py").write_text(THREADED)
    out = tmp_path / "rank"
    zygote = replace(plan.zygote, argv=(*plan.zygote.argv[:-1], preload))  # for "json"
    agent = (sys.executable, str(tmp_path / "agent_wait.py"), str(out), str(tmp_path))
    return replace(plan, argv=agent, zygote=zygote), out


def noted(out: Path) -> list[str]:
    return [Path(f"{out}.{r}").read_text().split()[1] for r in (0, 1)]


# What `torch.cuda.is_available()` leaves in a process without a GPU to show for it: the CUDA
# driver library mapped in (here a file of that name).
FAKE_CUDA = """
import mmap, os
_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libcuda.so.1")
with open(_path, "wb") as f:
    f.write(bytes(mmap.PAGESIZE))
with open(_path, "rb") as f:
    DRIVER = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
"""


@pytest.mark.parametrize(
    ("preload", "why"),
    [("threaded", "threads alive"), ("fakecuda", "the CUDA driver is loaded")],
    ids=["thread", "cuda-driver"],
)
def test_a_zygote_that_refuses_to_fork_leaves_the_ranks_to_start_cold(
    tmp_path, monkeypatch, preload, why
):
    """A thread alive after the preload (what a user's OMP_NUM_THREADS > 1 does to torch's
    import), or CUDA's driver loaded by it, is no failure: the stubs start their ranks cold,
    and the state says why."""
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    (tmp_path / "fakecuda.py").write_text(FAKE_CUDA)
    plan, out = waiting_plan(tmp_path, preload)
    result = launch(plan, tick_s=0.2)
    state = result.zygote
    assert result.exit_code == 0 and state is not None and state.error is None, state
    assert (state.used, state.forked, state.exit_code) == (False, 0, 3), state
    assert state.not_used is not None and why in state.not_used, state
    assert state.hash_seed == "fixed"  # the cold ranks get the launcher's seed too
    assert noted(out) == ["False", "False"]
    assert not result.leftovers


@pytest.fixture
def short_tmp():
    """A folder whose paths fit a Unix socket, so the socket stays in the run's own folder
    (pytest's `tmp_path` can be too long, and then the socket goes to a fresh private one)."""
    folder = Path(tempfile.mkdtemp(prefix="dqz-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_note_an_earlier_zygote_left_does_not_send_the_ranks_cold(short_tmp):
    """What a launcher killed before its zygote's `stop` left at the socket path (the socket,
    the refusal note) is not this launch's: its ranks are forked and the state names no
    refusal."""
    plan, out = waiting_plan(short_tmp, "json")
    assert plan.zygote.private_dir is None, "the socket must sit in the run's own folder here"
    sock = str(plan.zygote.socket)
    Path(sock).parent.mkdir(parents=True, exist_ok=True)
    Path(sock).write_text("")
    Path(refusal_path(sock)).write_text("pid 1\ncannot fork ranks after the preload: STALE\n")
    result = launch(plan, tick_s=0.2)
    state = result.zygote
    assert result.exit_code == 0 and state is not None and state.error is None, state
    assert (state.used, state.forked, state.not_used) == (True, 2, None), state
    assert noted(out) == ["True", "True"]


def test_the_private_socket_folder_is_this_runs_alone_and_goes_with_it(tmp_path):
    """Where the socket goes to /tmp: the launcher makes its folder (0700) before the zygote
    starts and removes it at the end; one already there (anyone's) is not used, nor removed."""
    folder = Path("/tmp") / f"dcpqual-zygote-test-{os.getpid()}"
    waits = (sys.executable, "-c", "import time; time.sleep(60)")
    plan = ZygotePlan(argv=waits, socket=folder / "zygote.sock", private_dir=folder)
    run = ZygoteRun.start(plan, tmp_path / "zygote.log", dict(os.environ), None)
    try:
        assert run.error is None and run.proc is not None
        assert folder.stat().st_mode & 0o777 == 0o700
    finally:
        run.stop()
    assert not folder.exists()
    folder.mkdir()
    try:
        taken = ZygoteRun.start(plan, tmp_path / "zygote.log", dict(os.environ), None)
        assert taken.proc is None and "socket folder" in (taken.error or "")
        taken.stop()
        assert folder.is_dir(), "a folder the launcher did not make was removed"
    finally:
        folder.rmdir()


def test_a_used_zygote_says_how_many_it_forked_and_that_their_seed_was_fixed(tmp_path, monkeypatch):
    """The launcher starts the zygote with the seed it gives every rank (the ranks' own
    records state the seed: tests/test_verify_hash_seed.py)."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    plan, out = waiting_plan(tmp_path, "json")
    assert plan.zygote is not None and plan.zygote.env["PYTHONHASHSEED"].isdigit()
    result = launch(plan, tick_s=0.2)
    state = result.zygote
    assert result.exit_code == 0 and state is not None and state.error is None, state
    assert (state.used, state.forked, state.not_used) == (True, 2, None), state
    assert state.hash_seed == "fixed"
    assert noted(out) == ["True", "True"]
