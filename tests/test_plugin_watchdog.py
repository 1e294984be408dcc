"""The rank watchdog, in-process: timeouts, peer failures and SIGTERM end in recorded outcomes.

The watchdog's `exit_fn` is replaced by one that records the code, so the test process survives
what would end a rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from _support.watchdog import NODEID, CountingStore, make, open_world, record

from harness.rank import parentage
from harness.rank.agreement import LocalResult
from harness.rank.watchdog import EXIT_FAILED, EXIT_TERMINATED, in_collective


def test_a_test_past_its_timeout_is_failed_with_stacks_and_the_rank_exits(watchdog_world):
    out, chans, _ = watchdog_world
    dog, exits = make(watchdog_world, test_timeout_s=0.3)
    chans[1].post_result(0, LocalResult(rank=1, outcome="passed"))  # the peer finished fine
    dog.begin_test(0, NODEID)
    assert exits.done.wait(10), "watchdog never fired"
    assert exits.codes == [EXIT_FAILED]
    assert dog.body_done() is False  # the main thread must step aside now
    rec = record(out)
    [test] = rec.tests
    assert (test.nodeid, test.outcome, test.primary) == (NODEID, "failed", True)
    assert "timed out after" in (test.message or "")
    assert "not inside a torch.distributed call" in (test.message or "")
    assert rec.abort_reason == f"per-test timeout in {NODEID}" and rec.abort_primary
    assert not rec.complete
    assert "per-test timeout" in (out / "stacks" / "rank-00.txt").read_text()
    posted = chans[1].peer_results(0)[0]
    assert posted.kind == "timeout" and posted.fail_seq == 1
    notice = chans[1].abort_info()
    assert notice is not None and notice.rank == 0


def test_a_peer_failure_aborts_a_rank_still_in_the_test_after_the_grace(watchdog_world):
    out, chans, _ = watchdog_world
    dog, exits = make(watchdog_world, test_timeout_s=60, abort_grace_s=0.2)
    dog.begin_test(0, NODEID)
    seq = chans[1].next_fail_seq(0)
    chans[1].post_result(0, LocalResult(rank=1, outcome="failed", message="boom", fail_seq=seq))
    assert exits.done.wait(10)
    assert exits.codes == [EXIT_FAILED]
    [test] = record(out).tests
    assert (test.outcome, test.primary, test.failing_ranks) == ("error", False, (1,))
    assert "after rank(s) 1 failed it" in (test.message or "")


def test_a_rank_that_finishes_in_time_is_left_alone(watchdog_world):
    dog, exits = make(watchdog_world, test_timeout_s=0.5)
    dog.begin_test(0, NODEID)
    assert dog.body_done() is True
    dog.idle()
    time.sleep(1.0)
    assert exits.codes == []
    dog.stop()


def test_sigterm_through_the_wakeup_pipe_records_a_secondary_abort(watchdog_world, sigterm_pipe):
    out, chans, _ = watchdog_world
    dog, exits = make(watchdog_world, wakeup_fd=sigterm_pipe.read_fd, test_timeout_s=60)
    dog.begin_test(0, NODEID)
    sigterm_pipe.send()
    assert exits.done.wait(10)
    assert exits.codes == [EXIT_TERMINATED]
    rec = record(out)
    assert rec.abort_reason is not None and "SIGTERM" in rec.abort_reason
    assert not rec.abort_primary
    [test] = rec.tests
    assert (test.outcome, test.primary, test.agreed) == ("error", False, False)
    assert chans[1].peer_results(0)[0].kind == "aborted"


def test_sigterm_after_the_session_finished_leaves_the_record_alone(watchdog_world, sigterm_pipe):
    out, _, keeper = watchdog_world
    dog, exits = make(watchdog_world, wakeup_fd=sigterm_pipe.read_fd)
    dog.session_finishing()
    keeper.finish()
    dog.session_finished()
    sigterm_pipe.send()
    assert exits.done.wait(10)
    assert exits.codes == [EXIT_TERMINATED]
    rec = record(out)
    assert rec.complete and rec.abort_reason is None


def test_sigterm_while_the_session_ends_completes_the_record_and_says_so(
    watchdog_world, sigterm_pipe
):
    out, _, keeper = watchdog_world
    dog, exits = make(watchdog_world, wakeup_fd=sigterm_pipe.read_fd)
    dog.session_finishing()
    sigterm_pipe.send()
    deadline = time.monotonic() + 10
    while keeper.stop_reason is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exits.codes == []  # it noted why, and now waits for the session to finish
    keeper.finish()
    dog.session_finished()
    assert exits.done.wait(10)
    assert exits.codes == [EXIT_TERMINATED]
    rec = record(out)
    assert rec.complete and not rec.abort_primary
    assert rec.abort_reason is not None and "SIGTERM" in rec.abort_reason


def test_heartbeat_touches_the_record(watchdog_world):
    out, _, _ = watchdog_world
    path = out / "records" / "rank-00.json"
    os.utime(path, (1_000_000, 1_000_000))
    dog, _ = make(watchdog_world, heartbeat_s=0.05)
    deadline = time.monotonic() + 5
    while path.stat().st_mtime < 2_000_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    dog.stop()
    assert path.stat().st_mtime > 2_000_000


def test_a_timeout_in_a_lane_is_settled_with_the_lane_not_the_world(watchdog_world):
    """A sub-world case placed on rank 0 alone: rank 1 never runs it, so its silence is no
    blame; the rank that timed out is primary."""
    out, _, _ = watchdog_world
    dog, exits = make(watchdog_world, test_timeout_s=0.3)
    dog.begin_test(0, NODEID, ranks=(0,))
    assert exits.done.wait(10), "watchdog never fired"
    [test] = record(out).tests
    assert (test.outcome, test.primary, test.failing_ranks) == ("failed", True, (0,))
    assert test.agreed


def test_another_lanes_trouble_does_not_abort_a_sub_world_case(watchdog_world):
    """A rank of another lane left the job (the abort key is set): a world-wide case is
    aborted after the grace, a case on this rank's lane runs on (the launcher ends the job)."""
    _, chans, _ = watchdog_world
    dog, exits = make(watchdog_world, test_timeout_s=60, abort_grace_s=0.1)
    chans[1].signal_abort("rank 1 timed out in another lane's case")
    dog.begin_test(0, NODEID, ranks=(0,))
    assert not exits.done.wait(0.6), "a lane case was aborted for another lane's trouble"
    assert dog.body_done()
    dog.begin_test(1, NODEID)
    assert exits.done.wait(10), "a world-wide case must still be aborted"
    assert exits.codes == [EXIT_FAILED]


def test_while_nothing_happens_a_running_test_costs_one_store_read_per_look(tmp_path):
    store = CountingStore(dist.HashStore())
    world = open_world(tmp_path, store)
    dog, exits = make(world, tick_s=0.05, heartbeat_s=0.2, test_timeout_s=60)
    dog.begin_test(0, NODEID)
    time.sleep(0.6)
    looks = dict(store.calls)
    assert set(looks) == {"add"} and 3 <= looks["add"] <= 20, looks  # the alarm counter only
    assert dog.body_done()
    dog.idle()
    store.calls.clear()
    time.sleep(0.4)
    assert store.total() == 0, f"an idle rank's watchdog used the store: {store.calls}"
    # Control: once a peer failed, the same looks read the failure and abort keys too.
    world[1][1].next_fail_seq(1)
    dog.begin_test(1, NODEID)
    deadline = time.monotonic() + 5
    while store.calls["check"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.calls["check"] >= 1, store.calls
    dog.stop()
    assert exits.codes == []


def test_a_peer_failure_after_an_earlier_alarm_elsewhere_is_still_seen(watchdog_world):
    """Another lane's failure moves the alarm while this rank runs its own case; a failure of
    the next world-wide test moves it again, and this rank is aborted for it."""
    _, chans, _ = watchdog_world
    dog, exits = make(watchdog_world, test_timeout_s=60, abort_grace_s=0.1)
    dog.begin_test(0, NODEID, ranks=(0,))
    chans[1].next_fail_seq(5)  # a case of rank 1's lane
    assert not exits.done.wait(0.4), "another lane's failure aborted this lane's case"
    assert dog.body_done()
    dog.idle()
    dog.begin_test(1, NODEID)
    seq = chans[1].next_fail_seq(1)
    chans[1].post_result(1, LocalResult(rank=1, outcome="failed", message="boom", fail_seq=seq))
    assert exits.done.wait(10), "the peer's failure of the running test was never seen"
    assert exits.codes == [EXIT_FAILED]


def test_the_agents_exit_wakes_the_watchdog_at_once(watchdog_world):
    """With the heartbeat and the looks 30 s apart, only the agent's pidfd can wake it."""
    out, _, _ = watchdog_world
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        try:
            os.close(os.pidfd_open(agent.pid))
        except OSError:
            pytest.skip("this kernel gives no pidfd: the parent pid is compared each tick")
        _, exits = make(watchdog_world, agent_pid=agent.pid, tick_s=30, heartbeat_s=30)
        time.sleep(0.2)
        assert exits.codes == []
        agent.kill()
        assert exits.done.wait(5), "the agent's exit was not noticed"
    finally:
        agent.kill()
        agent.wait()
    assert exits.codes == [EXIT_TERMINATED]
    assert "orphaned" in (record(out).abort_reason or "")


def test_a_forked_ranks_watchdog_waits_on_its_agent_not_on_its_parent(watchdog_world, monkeypatch):
    """Forked by the agent's forkserver, the rank's parent is the server: the agent's exit must
    still wake it, while the server lives on."""
    out, _, _ = watchdog_world
    agent, server = (
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in "as"
    )
    try:
        try:
            os.close(os.pidfd_open(agent.pid))
        except OSError:
            pytest.skip("this kernel gives no pidfd")
        forked = parentage.Parentage(agent=agent.pid, forkserver=server.pid)
        monkeypatch.setattr(parentage, "_forked", forked)
        _, exits = make(watchdog_world, tick_s=30, heartbeat_s=30)
        time.sleep(0.2)
        assert exits.codes == []
        agent.kill()
        assert exits.done.wait(5), "the agent's exit was not noticed"
    finally:
        for proc in (agent, server):
            proc.kill()
            proc.wait()
    assert exits.codes == [EXIT_TERMINATED]
    assert "the torchrun agent that started this rank is gone" in (record(out).abort_reason or "")


@pytest.mark.parametrize(
    ("between", "gone"),
    [
        ({}, "the torchrun agent that started this rank"),
        ({"forkserver": 3}, "the forkserver that forked this rank"),
    ],
    ids=["cold", "forkserver"],
)
def test_an_orphaned_rank_names_the_parent_that_left(watchdog_world, monkeypatch, between, gone):
    """Its parent gone while its agent lives: the parent the rank was started from is named."""
    monkeypatch.setattr(parentage, "_forked", parentage.Parentage(agent=os.getppid(), **between))
    dog, _ = make(watchdog_world, tick_s=30, heartbeat_s=30)
    try:
        assert dog._orphaned_by(agent_gone=False) == f"orphaned: {gone} is gone"
        assert dog._orphaned_by(agent_gone=True) == (
            "orphaned: the torchrun agent that started this rank is gone"
        )
    finally:
        dog.stop()


def test_stop_wakes_a_sleeping_watchdog_at_once(watchdog_world):
    dog, _ = make(watchdog_world, tick_s=30, heartbeat_s=30)
    time.sleep(0.1)
    started = time.monotonic()
    dog.stop()
    assert time.monotonic() - started < 1 and not dog.is_alive()


def _stack(*files: str) -> SimpleNamespace | None:
    """A frame chain, outermost file first, as `sys._current_frames` gives its innermost."""
    frame = None
    for name in files:
        frame = SimpleNamespace(f_code=SimpleNamespace(co_filename=name), f_back=frame)
    return frame


ELASTIC = "/site-packages/torch/distributed/elastic/multiprocessing/api.py"
RUNPY = "<frozen runpy>"
C10D = "/site-packages/torch/distributed/distributed_c10d.py"
TEST = "/suites/test_x.py"


@pytest.mark.parametrize(
    ("files", "inside"),
    [
        ((RUNPY, RUNPY, TEST), False),  # a cold rank in plain Python
        ((RUNPY, RUNPY, TEST, C10D), True),  # a cold rank in a collective
        ((ELASTIC, "/harness/rank/forkserved.py", RUNPY, TEST), False),  # the agent's rank
        ((ELASTIC, "/harness/rank/forkserved.py", RUNPY, TEST, C10D), True),
    ],
    ids=["cold", "cold-collective", "forkserver", "forkserver-collective"],
)
def test_only_frames_above_the_ranks_module_entry_say_it_is_in_a_collective(
    files: tuple[str, ...], inside: bool
) -> None:
    """torchelastic's own wrapper lies below a forkserver rank's `-m` entry: it is no call the
    rank is blocked in (the control: without the entry, it would be taken for one)."""
    assert in_collective(_stack(*files)) is inside
    assert in_collective(_stack(ELASTIC, TEST)) is True
    assert in_collective(None) is False
