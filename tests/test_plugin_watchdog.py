"""The rank watchdog, in-process: timeouts, peer failures and SIGTERM end in recorded outcomes.

The watchdog's `exit_fn` is replaced by one that records the code, so the test process survives
what would end a rank.
"""

from __future__ import annotations

import os
import time

from _support.watchdog import NODEID, make, record

from harness.rank.agreement import LocalResult
from harness.rank.watchdog import EXIT_FAILED, EXIT_TERMINATED


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
    assert chans[1].abort_info()["rank"] == 0


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
