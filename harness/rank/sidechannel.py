"""The ranks' side channel: a c10d store shared by all ranks, outside the process group.

Why not a collective: a collective waits for every rank, forever (or gloo's timeout), so one dead
or hung rank would hang the others. Store keys are posted and polled with deadlines, survive a
rank's death (torchrun's agent hosts the store), and let a rank that fails tell its peers at
once. Keys (under a per-run prefix):

    col/<rank>          the test ids this rank collected (JSON list)
    res/<i>/<rank>      this rank's `LocalResult` for test number i
    blk/<b>/<rank>      this rank's `BlockReport`: its failures in block b of sub-world cases
                        (`harness.rank.subworld`)
    failseq             global counter: order in which ranks observed failures
    fails/<i>           how many ranks failed test i so far
    abort               an `AbortNotice`, set by the first rank leaving abnormally (SIGTERM,
                        timeout, abort)
    alarms              global counter, raised after every failure and every abort: a watchdog
                        reads this one key while nothing happened, and the others only when it
                        moved

Every read tolerates a lost store (the agent went away): callers get what was seen so far.

One connection: the channel and the watchdog share the default group's store client, the one
the rendezvous opened. c10d serializes every operation of a client under its own lock, so
threads may share it; a new connection after the rendezvous costs every rank seconds at 16
ranks. Reads poll with `check` instead of `store.wait`: a wait holds the client's lock until
its keys arrive, which would leave the watchdog unable to tell peers this rank is leaving
while the main thread waits for them, and a wait cut into slices logs two c10d socket warnings
per expired slice. The one wait left is c10d's own: while the main thread creates a process
group, its rendezvous `get`s hold the client, and the watchdog's store calls queue behind them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch.distributed as dist
from pydantic import NonNegativeInt
from pydantic.dataclasses import dataclass as pydantic_dataclass

from harness.rank.agreement import LocalResult
from harness.rank.subworld import BlockReport
from harness.schema.base import JsonValue
from harness.schema.capture import STRICT

StoreLost = RuntimeError  # c10d raises RuntimeError subclasses (DistStoreError, DistNetworkError)
T = TypeVar("T")


@pydantic_dataclass(frozen=True, config=STRICT)
class AbortNotice(JsonValue):
    """The `abort` key: the first rank that left abnormally, and why (peers name it)."""

    rank: NonNegativeInt
    reason: str


class SideChannel:
    """Deadline-bounded exchanges over a c10d store. One instance per thread (see `clone`),
    all on the same store client."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        *,
        poll_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.poll_s = poll_s
        self.clock = clock
        self.lost = False

    @classmethod
    def for_process_group(cls, rank: int, world_size: int) -> SideChannel:
        """The default group's store client (no new connection), under this run's key prefix."""
        base = dist.distributed_c10d._get_default_store()
        run = os.environ.get("TORCHELASTIC_RUN_ID", "local")
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return cls(dist.PrefixStore(f"dcpqual/{run}/{attempt}/", base), rank, world_size)

    def clone(self) -> SideChannel:
        """The channel for another thread: its own state (`lost`), the same store client."""
        return SideChannel(
            self.store, self.rank, self.world_size, poll_s=self.poll_s, clock=self.clock
        )

    # -- primitives -----------------------------------------------------------------------

    def _set(self, key: str, value: T, encode: Callable[[T], str] = json.dumps) -> None:
        try:
            self.store.set(key, encode(value))
        except StoreLost:
            self.lost = True

    def _get_many(self, keys: Sequence[str], decode: Callable[[bytes], T]) -> list[T] | None:
        try:
            if not self.store.check(list(keys)):
                return None
            return [decode(v) for v in self.store.multi_get(list(keys))]
        except StoreLost:
            self.lost = True
            return None

    def _present(self, keys: Sequence[str]) -> list[str]:
        found = []
        for key in keys:
            try:
                if self.store.check([key]):
                    found.append(key)
            except StoreLost:
                self.lost = True
                break
        return found

    def _counter(self, key: str, delta: int = 0) -> int:
        try:
            return int(self.store.add(key, delta))
        except StoreLost:
            self.lost = True
            return 0

    def _gather(
        self,
        prefix: str,
        deadline: float,
        *,
        early: Callable[[], bool] | None = None,
        ranks: Sequence[int] | None = None,
        decode: Callable[[bytes], T],
    ) -> dict[int, T]:
        """Values of `prefix/<rank>` for every rank (or `ranks`), or those that arrived by
        `deadline`.

        `early()` returning True (a peer aborted) ends the wait sooner, after a short grace
        for stragglers that are still posting. It is asked only once the quick looks are over:
        most exchanges end within them, and each question is a store round trip.
        """
        expected = list(range(self.world_size) if ranks is None else ranks)
        keys = [f"{prefix}/{r}" for r in expected]
        cut = deadline
        # Peers mostly post within milliseconds of each other: look again soon, then back off
        # to `poll_s` (a fixed pause cost every exchange half a pause on average).
        pause = self.poll_s / 8
        while not self.lost:
            values = self._get_many(keys, decode)
            if values is not None:
                return dict(zip(expected, values, strict=True))
            now = self.clock()
            if now >= cut:
                break
            slow = pause >= self.poll_s
            if early is not None and slow and cut == deadline and early():
                cut = min(deadline, now + 2.0)
            time.sleep(pause)
            pause = min(self.poll_s, pause * 2)
        present = self._present(keys)
        out: dict[int, T] = {}
        for key in present:
            values = self._get_many([key], decode)
            if values is not None:
                out[int(key.rsplit("/", 1)[1])] = values[0]
        return out

    # -- collection -----------------------------------------------------------------------

    def post_collection(self, nodeids: Sequence[str]) -> None:
        self._set(f"col/{self.rank}", list(nodeids))

    def gather_collections(self, deadline: float) -> dict[int, list[str]]:
        lists = self._gather("col", deadline, early=self.aborted, decode=json.loads)
        return {r: list(v) for r, v in lists.items()}

    # -- per-test results -----------------------------------------------------------------

    def next_fail_seq(self, index: int) -> int:
        """Claim a place in the global failure order, and count a failure of test `index`.
        The alarm is raised last, so whoever sees it move finds the failure counted."""
        self._counter(f"fails/{index}", 1)
        seq = self._counter("failseq", 1)
        self._counter("alarms", 1)
        return seq

    def failures_in(self, index: int) -> int:
        return self._counter(f"fails/{index}")

    def alarms(self) -> int:
        """How many failures and aborts any rank has reported so far (one store read)."""
        return self._counter("alarms")

    def post_result(self, index: int, result: LocalResult) -> None:
        self._set(f"res/{index}/{self.rank}", result, encode=LocalResult.to_wire)

    def has_posted(self, index: int) -> bool:
        return bool(self._present([f"res/{index}/{self.rank}"]))

    def peer_results(self, index: int) -> dict[int, LocalResult]:
        """Whatever results of test `index` are posted now (no waiting)."""
        return self.gather_results(index, deadline=self.clock())

    def gather_results(
        self, index: int, deadline: float, ranks: Sequence[int] | None = None
    ) -> dict[int, LocalResult]:
        """Results of test `index` from every rank, or from `ranks` (the lane that ran it).

        A lane's wait is not cut short by an abort elsewhere in the world: its own ranks are
        still finishing their case, and the launcher ends the job when a rank leaves."""
        early = self.aborted if ranks is None else None
        return self._gather(
            f"res/{index}", deadline, early=early, ranks=ranks, decode=LocalResult.from_wire
        )

    # -- sub-world blocks -----------------------------------------------------------------

    def post_block(self, block: int, report: BlockReport) -> None:
        self._set(f"blk/{block}/{self.rank}", report, encode=BlockReport.to_wire)

    def gather_block(self, block: int, deadline: float) -> dict[int, BlockReport]:
        return self._gather(
            f"blk/{block}", deadline, early=self.aborted, decode=BlockReport.from_wire
        )

    # -- aborts ---------------------------------------------------------------------------

    def signal_abort(self, reason: str) -> None:
        """Tell peers this rank is leaving abnormally; the first reason wins."""
        try:
            self.store.compare_set("abort", "", AbortNotice(self.rank, reason).to_wire())
        except StoreLost:
            self.lost = True
            return
        self._counter("alarms", 1)

    def abort_info(self) -> AbortNotice | None:
        values = self._get_many(["abort"], decode=AbortNotice.from_wire)
        return None if values is None else values[0]

    def aborted(self) -> bool:
        return self.lost or bool(self._present(["abort"]))
