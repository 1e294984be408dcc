"""Pure decisions the ranks make together: same tests collected? which rank failed first?

Rank-side and free of I/O, so every rule here is a unit test. The side channel
(`harness.rank.sidechannel`) moves `LocalResult`s between ranks; this module turns the set of
results for one test into one `Agreement` that every rank applies identically.

Blame rules, in order (xdist and torchrun's "first observed failure" in spirit):
0. A rank whose own action broke the world for every rank (`broke_world`: it destroyed its
   default process group) is primary, even when a peer's collective failed first because of it.
1. A rank that never reported (dead, or stuck so hard its watchdog could not post) is primary.
2. Otherwise the first ordinary failure (lowest store-counter `fail_seq`) is primary; every later
   failure, abort or timeout in that test is a follow-on (secondary).
3. Otherwise, for per-test timeouts: ranks not blocked inside a torch.distributed call are
   primary (they hung in their own code while peers waited for them); else ranks whose
   collective sequence number lags a peer's in a shared group; else every timed-out rank.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, NonNegativeInt
from pydantic.dataclasses import dataclass as pydantic_dataclass

from harness.schema.base import JsonValue
from harness.schema.capture import STRICT
from harness.schema.rank_record import Outcome, TestOutcome

ResultKind = Literal["ran", "timeout", "aborted"]
FAILING: frozenset[str] = frozenset({"failed", "error"})


@pydantic_dataclass(frozen=True, config=STRICT)
class LocalResult(JsonValue):
    """What one rank saw of one test, before agreement; what the side channel carries.

    `kind` is "ran" when the test finished normally on this rank, "timeout" when the watchdog
    gave up on it, "aborted" when the watchdog stopped it after a peer's failure. `seqs` maps a
    process group name to its collective sequence number; `in_collective` says whether the main
    thread was inside torch.distributed when the watchdog looked. `broke_world`: this rank's
    failure is its own action that breaks every rank's collectives (see `agree`, rule 0).
    """

    rank: NonNegativeInt
    outcome: Outcome
    kind: ResultKind = "ran"
    message: str | None = None
    duration_s: float = 0.0
    failed_at: float | None = None
    fail_seq: int | None = None
    in_collective: bool = False
    seqs: dict[str, int] = Field(default_factory=dict)
    broke_world: bool = False

    @property
    def failing(self) -> bool:
        return self.outcome in FAILING


@dataclass(frozen=True)
class Agreement:
    """The verdict of one test that every rank reports. `primary_ranks` is empty on a pass."""

    nodeid: str
    outcome: Outcome
    primary_ranks: tuple[int, ...] = ()
    message: str | None = None
    missing_ranks: tuple[int, ...] = ()
    complete: bool = True  # False: decided without every rank's result

    @property
    def failed(self) -> bool:
        return self.outcome in FAILING

    def describe(self) -> str:
        ranks = ", ".join(str(r) for r in self.primary_ranks)
        return f"rank {ranks}: {self.message}" if self.message else f"rank {ranks} failed"

    def outcome_for(self, local: LocalResult) -> TestOutcome:
        """This rank's line in its record: the agreed verdict, its own message when it failed."""
        if not self.failed:
            return TestOutcome(
                nodeid=self.nodeid,
                outcome=local.outcome,
                duration_s=local.duration_s,
                message=local.message,
                agreed=self.complete,
            )
        primary = local.rank in self.primary_ranks
        if local.failing:
            message = local.message
            outcome = local.outcome
        else:
            message = f"follow-on: {self.describe()}"
            outcome = self.outcome
        if not primary:
            message = f"[secondary] {message}" if local.failing else message
        return TestOutcome(
            nodeid=self.nodeid,
            outcome=outcome,
            duration_s=local.duration_s,
            message=message,
            primary=primary,
            failing_ranks=self.primary_ranks,
            failed_at=local.failed_at,
            agreed=self.complete,
        )


def _blame_timeouts(timeouts: Sequence[LocalResult], everyone: Sequence[LocalResult]) -> list[int]:
    outside = [r.rank for r in timeouts if not r.in_collective]
    if outside:
        return outside
    behind: list[int] = []
    for res in timeouts:
        for group, seq in res.seqs.items():
            peers = [o.seqs[group] for o in everyone if group in o.seqs]
            if peers and seq < max(peers):
                behind.append(res.rank)
                break
    return behind or [r.rank for r in timeouts]


def agree(
    nodeid: str,
    results: Mapping[int, LocalResult],
    world_size: int,
    ranks: Sequence[int] | None = None,
) -> Agreement:
    """One verdict from every rank's result (every rank of `ranks`, the lane that ran a
    sub-world case, when given); expected ranks absent from `results` never reported."""
    expected = range(world_size) if ranks is None else ranks
    missing = tuple(r for r in expected if r not in results)
    posted = [results[r] for r in sorted(results)]
    failures = [r for r in posted if r.failing]
    breakers = [r for r in failures if r.broke_world]
    if breakers:
        first = min(breakers, key=lambda r: r.rank)
        return Agreement(
            nodeid, "failed", tuple(r.rank for r in breakers), first.message, missing, not missing
        )
    if missing:
        return Agreement(
            nodeid=nodeid,
            outcome="error",
            primary_ranks=missing,
            message="never reported a result for this test (died or stopped responding)",
            missing_ranks=missing,
            complete=False,
        )
    ran = [r for r in failures if r.kind == "ran"]
    if ran:
        first = min(ran, key=lambda r: (r.fail_seq if r.fail_seq is not None else 1 << 62, r.rank))
        return Agreement(nodeid, first.outcome, (first.rank,), first.message)
    timeouts = [r for r in failures if r.kind == "timeout"]
    if timeouts:
        blamed = sorted(_blame_timeouts(timeouts, posted))
        msg = next(r.message for r in timeouts if r.rank == blamed[0])
        return Agreement(nodeid, "failed", tuple(blamed), msg)
    if failures:  # only aborts: their messages name the rank they followed
        first = min(failures, key=lambda r: r.rank)
        return Agreement(nodeid, "error", (first.rank,), first.message)
    outcomes = {r.outcome for r in posted}
    outcome: Outcome = "skipped" if outcomes == {"skipped"} else "passed"
    return Agreement(nodeid, outcome)


@dataclass(frozen=True)
class CollectionMismatch:
    """Ranks collected different tests. `odd_ranks` differ from the majority list."""

    reference_rank: int
    odd_ranks: tuple[int, ...]
    diff: str

    def describe(self) -> str:
        ranks = ", ".join(str(r) for r in self.odd_ranks)
        return (
            f"ranks collected different tests: rank(s) {ranks} differ from rank "
            f"{self.reference_rank}\n{self.diff}"
        )


def compare_collections(lists: Mapping[int, Sequence[str]]) -> CollectionMismatch | None:
    """None when every rank collected the same ids in the same order, else who differs and how.

    The majority list is the reference (ties: the lowest rank's), so a single odd rank is
    named even when it is rank 0.
    """
    keyed = {rank: tuple(ids) for rank, ids in lists.items()}
    counts = Counter(keyed.values())
    if len(counts) <= 1:
        return None
    best = max(counts.values())
    reference_rank = min(r for r, ids in keyed.items() if counts[ids] == best)
    reference = keyed[reference_rank]
    odd = tuple(sorted(r for r, ids in keyed.items() if ids != reference))
    first_odd = odd[0]
    diff = "\n".join(
        difflib.unified_diff(
            list(reference),
            list(keyed[first_odd]),
            fromfile=f"rank {reference_rank}",
            tofile=f"rank {first_odd}",
            lineterm="",
        )
    )
    return CollectionMismatch(reference_rank, odd, diff)
