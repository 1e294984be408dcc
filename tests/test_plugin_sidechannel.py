"""The side channel over an in-process c10d store: bounded waits, abort signals, lost stores."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch.distributed as dist
from _support.watchdog import CountingStore
from pydantic import ValidationError

from harness.rank.agreement import LocalResult
from harness.rank.sidechannel import AbortNotice, SideChannel
from harness.rank.subworld import BlockReport


def channels(world: int) -> list[SideChannel]:
    store = dist.HashStore()
    return [SideChannel(store, r, world, poll_s=0.005) for r in range(world)]


def test_gather_returns_every_rank_once_all_posted():
    chans = channels(3)
    for c in chans:
        c.post_result(0, LocalResult(rank=c.rank, outcome="passed"))
    got = chans[0].gather_results(0, time.monotonic() + 5)
    assert sorted(got) == [0, 1, 2]
    assert all(r.outcome == "passed" for r in got.values())


def test_gather_waits_for_a_late_rank():
    chans = channels(2)
    chans[0].post_result(4, LocalResult(rank=0, outcome="passed"))

    def late():
        time.sleep(0.2)
        chans[1].post_result(4, LocalResult(rank=1, outcome="failed", fail_seq=1))

    threading.Thread(target=late).start()
    got = chans[0].gather_results(4, time.monotonic() + 5)
    assert got[1].outcome == "failed"


def test_a_peer_posting_just_after_is_seen_well_before_a_full_pause():
    store = dist.HashStore()
    mine, peer = (SideChannel(store, r, 2, poll_s=1.0) for r in range(2))
    mine.post_result(0, LocalResult(rank=0, outcome="passed"))
    threading.Timer(0.02, peer.post_result, (0, LocalResult(rank=1, outcome="passed"))).start()
    started = time.monotonic()
    assert sorted(mine.gather_results(0, started + 10)) == [0, 1]
    assert time.monotonic() - started < 0.6


def test_a_long_wait_backs_off_to_the_poll_interval(monkeypatch: pytest.MonkeyPatch):
    now = [0.0]
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    monkeypatch.setattr("harness.rank.sidechannel.time.sleep", sleep)
    mine = SideChannel(dist.HashStore(), 0, 2, poll_s=0.08, clock=lambda: now[0])
    assert mine.gather_results(0, deadline=0.5) == {}
    assert pauses == [0.01, 0.02, 0.04, 0.08, 0.08, 0.08, 0.08, 0.08, 0.08]


def test_gather_stops_at_the_deadline_with_what_arrived():
    chans = channels(3)
    chans[0].post_result(1, LocalResult(rank=0, outcome="passed"))
    chans[2].post_result(1, LocalResult(rank=2, outcome="passed"))
    started = time.monotonic()
    got = chans[0].gather_results(1, started + 0.3)
    assert sorted(got) == [0, 2]
    assert time.monotonic() - started < 2


def test_an_abort_cuts_a_long_wait_short():
    chans = channels(3)
    chans[0].post_result(2, LocalResult(rank=0, outcome="passed"))
    chans[1].signal_abort("terminated")
    started = time.monotonic()
    got = chans[0].gather_results(2, started + 60)
    assert sorted(got) == [0]
    assert time.monotonic() - started < 5


def test_first_abort_reason_wins():
    chans = channels(2)
    chans[1].signal_abort("first")
    chans[0].signal_abort("second")
    assert chans[0].abort_info() == AbortNotice(rank=1, reason="first")
    assert chans[0].aborted()


def test_failure_order_is_global_and_counted_per_test():
    chans = channels(3)
    assert chans[2].next_fail_seq(7) == 1
    assert chans[0].next_fail_seq(7) == 2
    assert chans[1].next_fail_seq(8) == 3
    assert (chans[0].failures_in(7), chans[0].failures_in(8), chans[0].failures_in(9)) == (2, 1, 0)


def test_collections_are_exchanged():
    chans = channels(2)
    chans[0].post_collection(["a", "b"])
    chans[1].post_collection(["a"])
    assert chans[1].gather_collections(time.monotonic() + 5) == {0: ["a", "b"], 1: ["a"]}


class DeadStore:
    """A store whose server is gone: every call raises like a lost TCPStore connection."""

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise RuntimeError("Connection reset by peer")

        return fail


def test_a_lost_store_never_hangs_and_is_reported():
    chan = SideChannel(DeadStore(), 0, 4, poll_s=0.005)  # type: ignore[arg-type]
    chan.post_result(0, LocalResult(rank=0, outcome="passed"))
    assert chan.gather_results(0, time.monotonic() + 30) == {}
    assert chan.lost and chan.aborted()
    assert chan.next_fail_seq(0) == 0


def test_a_lane_gathers_its_own_ranks_keyed_by_global_rank():
    chans = channels(4)
    for c in chans[2:]:
        c.post_result(6, LocalResult(rank=c.rank, outcome="passed"))
    started = time.monotonic()
    got = chans[2].gather_results(6, started + 5, ranks=(2, 3))
    assert sorted(got) == [2, 3] and got[3].rank == 3
    assert time.monotonic() - started < 2, "ranks 0 and 1 are not waited for"


def test_block_states_are_gathered_from_every_rank():
    chans = channels(2)
    chans[0].post_block(1, BlockReport())
    chans[1].post_block(1, BlockReport(failed=(4,), hard=True))
    assert chans[0].gather_block(1, time.monotonic() + 5) == {
        0: BlockReport(failed=(), hard=False),
        1: BlockReport(failed=(4,), hard=True),
    }


def test_the_wire_keeps_its_json_shape_and_refuses_unknown_keys():
    """Ranks of one run may post and read these keys from different threads and versions of
    the value; the JSON is the contract: plain objects, unknown keys an error."""
    chans = channels(2)
    chans[1].post_block(2, BlockReport(failed=(3, 5), hard=False))
    chans[1].signal_abort("terminated")
    assert json.loads(chans[0].store.get("blk/2/1")) == {"failed": [3, 5], "hard": False}
    assert json.loads(chans[0].store.get("abort")) == {"rank": 1, "reason": "terminated"}
    chans[0].store.set("blk/2/0", json.dumps({"failed": [], "hard": False, "extra": 1}))
    with pytest.raises(ValidationError):
        chans[0].gather_block(2, time.monotonic() + 5)


def test_a_thread_s_channel_shares_the_store_client():
    """No new connection for the watchdog: its channel is the same client, its own state."""
    chan = channels(2)[0]
    other = chan.clone()
    assert other.store is chan.store and other is not chan
    other.lost = True
    assert not chan.lost


def test_failures_and_aborts_raise_the_alarm_and_a_lost_store_reads_as_none():
    chans = channels(2)
    assert chans[0].alarms() == 0
    chans[1].next_fail_seq(3)
    assert chans[0].alarms() == 1
    chans[1].signal_abort("leaving")
    chans[0].signal_abort("leaving too")  # the first reason stays; every abort is an alarm
    assert chans[0].alarms() == 3
    lost = SideChannel(DeadStore(), 0, 2)  # type: ignore[arg-type]
    assert lost.alarms() == 0 and lost.lost


class LateStore(CountingStore):
    """Runs `late` just before its third `check`: a peer that posts during the quick looks."""

    def __init__(self, inner: dist.Store, late) -> None:
        super().__init__(inner)
        self.late = late

    def check(self, keys):
        self.calls["check"] += 1
        self.checked.append(list(keys))
        if len(self.checked) == 3:
            self.late()
        return self.inner.check(keys)


def test_an_exchange_that_completes_within_the_quick_looks_never_asks_about_aborts():
    chans: list[SideChannel] = []
    store = LateStore(dist.HashStore(), lambda: chans[1].post_result(0, ok(1)))
    chans += [SideChannel(store, r, 2, poll_s=0.08) for r in range(2)]  # type: ignore[arg-type]
    chans[0].post_result(0, ok(0))
    assert sorted(chans[0].gather_results(0, time.monotonic() + 5)) == [0, 1]
    assert len(store.checked) == 3 and ["abort"] not in store.checked, store.checked
    # Control: a long wait does ask, and an abort then cuts it short.
    chans[1].signal_abort("gone")
    started = time.monotonic()
    assert sorted(chans[0].gather_results(1, started + 60)) == []
    assert ["abort"] in store.checked and time.monotonic() - started < 5


def ok(rank: int) -> LocalResult:
    return LocalResult(rank=rank, outcome="passed")
