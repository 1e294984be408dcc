"""Sub-world placement: cases that need only a group of N ranks run side by side on disjoint
parts of the world, instead of every part of the world repeating them at the same time.

A case marked `subworld(size=N)` runs its collectives on groups of N consecutive ranks only
(its DCP group, from `new_subgroups(group_size=N)`). Run the plain way, each of the world's
world/N groups runs it at once, doing the same work as the others. When a suite holds such
cases of k >= 2 sizes, all smaller than the world, the plan splits the world into k lanes of
world/k consecutive ranks, the smallest size on the first lane, and places each case on its
size's lane: the lane's groups run it while the other lanes run cases of their own size (16
ranks, sizes 2 and 4: ranks 0-7 run the DCP2 cases as four groups of 2, ranks 8-15 the DCP4
cases as two groups of 4). Every case still runs on full groups of its size, at every rank
position within the group. A lane must be a whole number of groups of its size; where the
sizes do not fit (or there is only one), the cases run on the whole world as before.

A suite's placed cases move, in their order, to the front of that suite: one block. A rank
runs the block's cases of its lane, agreeing on each with its lane only; a case of another
lane is a skip on this rank, and its record line names the ranks that ran it. After the
block's last case every rank meets every other (`join`) to learn which of the block's cases
failed, so the whole world stops at the same place (`dcpqual run --maxfail`): a lane that reached
its stop runs none of its remaining cases of the block, which keep no outcome there, as any
test after a stop.

Pure apart from `join`, which moves one small value per rank over the side channel.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import NonNegativeInt
from pydantic.dataclasses import dataclass as pydantic_dataclass

from harness.schema.base import JsonValue
from harness.schema.capture import STRICT
from harness.schema.rank_record import SubworldBlock, SubworldLane

MARKER = "subworld"


@dataclass(frozen=True)
class Lane:
    """Consecutive ranks that run the cases of one group size, as groups of `size`."""

    size: int
    ranks: tuple[int, ...]

    def describe(self) -> str:
        return f"ranks {self.ranks[0]}-{self.ranks[-1]} (groups of {self.size})"


@dataclass(frozen=True)
class SubworldPlan:
    """Where each placed case runs, by its position in the (reordered) collection."""

    lanes: Mapping[int, Lane] = field(default_factory=dict)  # position -> lane
    blocks: Mapping[int, int] = field(default_factory=dict)  # position -> block number
    block_ends: Mapping[int, int] = field(default_factory=dict)  # last position -> block

    def lane_of(self, position: int) -> Lane | None:
        """The lane that runs this case; None: the whole world runs it."""
        return self.lanes.get(position)

    def block_ending_at(self, position: int) -> int | None:
        return self.block_ends.get(position)

    def block_size(self, block: int) -> int:
        return sum(1 for b in self.blocks.values() if b == block)

    def record_blocks(self) -> tuple[SubworldBlock, ...]:
        """Per block: its lanes and how many cases each runs (for the rank record)."""
        cases: dict[int, dict[Lane, int]] = {}
        for position, lane in sorted(self.lanes.items()):
            lanes = cases.setdefault(self.blocks[position], {})
            lanes[lane] = lanes.get(lane, 0) + 1
        return tuple(
            SubworldBlock(
                block, tuple(SubworldLane(lane.size, lane.ranks, n) for lane, n in lanes.items())
            )
            for block, lanes in sorted(cases.items())
        )


def lanes_for(sizes: Sequence[int], world_size: int) -> dict[int, Lane] | None:
    """One lane per distinct size (smallest first), or None when they cannot run side by side."""
    distinct = sorted({s for s in sizes if 0 < s < world_size and world_size % s == 0})
    if len(distinct) < 2 or world_size % len(distinct):
        return None
    width = world_size // len(distinct)
    if any(width % size for size in distinct):
        return None
    return {
        size: Lane(size, tuple(range(j * width, (j + 1) * width)))
        for j, size in enumerate(distinct)
    }


def plan(
    cases: Sequence[tuple[str, int | None]], world_size: int
) -> tuple[list[int], SubworldPlan]:
    """`(suite, sub-world size or None)` per collected case, in collection order -> the new
    order (indices into `cases`) and the plan over positions in that order. Each contiguous
    run of one suite's cases is planned on its own; a run whose sizes do not fit keeps its order.
    """
    order: list[int] = []
    lanes: dict[int, Lane] = {}
    blocks: dict[int, int] = {}
    block_ends: dict[int, int] = {}
    start = 0
    while start < len(cases):
        stop = start
        while stop < len(cases) and cases[stop][0] == cases[start][0]:
            stop += 1
        run = range(start, stop)
        by_size = lanes_for([s for _, s in (cases[i] for i in run) if s is not None], world_size)
        if by_size is None:
            order.extend(run)
        else:
            block = len(block_ends)
            for i in run:
                size = cases[i][1]
                if size in by_size:
                    lanes[len(order)] = by_size[size]
                    blocks[len(order)] = block
                    order.append(i)
            block_ends[len(order) - 1] = block
            order.extend(i for i in run if cases[i][1] not in by_size)
        start = stop
    return order, SubworldPlan(lanes, blocks, block_ends)


@pydantic_dataclass(frozen=True, config=STRICT)
class BlockReport(JsonValue):
    """What one rank posts after a block (`join`): its lane's agreed failed cases (positions in
    the collection) and whether one of them was a failure the run cannot go on after."""

    failed: tuple[NonNegativeInt, ...] = ()
    hard: bool = False


@dataclass
class BlockState:
    """This rank's view of the block it is in: its lane's agreed failures so far."""

    failed: list[int] = field(default_factory=list)  # positions of agreed failed cases
    hard: bool = False  # a failure the run cannot go on after (incomplete, timeout, abort)

    def note_failure(self, position: int, *, hard: bool) -> None:
        self.failed.append(position)
        self.hard = self.hard or hard

    def lane_stopped(self, failures_before: int, maxfail: int) -> bool:
        """Has this lane reached the stop? Then it runs no more of the block's cases."""
        if self.hard:
            return True
        return maxfail > 0 and bool(self.failed) and failures_before + len(self.failed) >= maxfail

    def report(self) -> BlockReport:
        return BlockReport(tuple(self.failed), self.hard)


@dataclass(frozen=True)
class Joined:
    """What every rank knows after a block: the agreed failed cases of every lane."""

    failed: tuple[int, ...]
    hard: bool
    missing: tuple[int, ...]

    def stop(self, failures_before: int, maxfail: int) -> bool:
        """Stop the session here? The same answer on every rank that joined."""
        if self.hard or self.missing:
            return True
        return maxfail > 0 and bool(self.failed) and failures_before + len(self.failed) >= maxfail


class Marked(Protocol):
    def get_closest_marker(self, name: str) -> Any: ...


def size_of(item: Marked) -> int | None:
    """The group size a case's `subworld(size=N)` (or `subworld(N)`) marker names, if any."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    size = marker.kwargs.get("size", marker.args[0] if marker.args else None)
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"{MARKER} marker needs a positive group size, got {size!r}")
    return size


class BlockChannel(Protocol):
    def post_block(self, block: int, report: BlockReport) -> None: ...

    def gather_block(self, block: int, deadline: float) -> dict[int, BlockReport]: ...


def merge(posted: Mapping[int, BlockReport], world_size: int) -> Joined:
    """Every rank's block report -> the one `Joined` every rank applies."""
    failed = sorted({p for report in posted.values() for p in report.failed})
    hard = any(report.hard for report in posted.values())
    missing = tuple(r for r in range(world_size) if r not in posted)
    return Joined(tuple(failed), hard, missing)


def join(
    channel: BlockChannel, block: int, state: BlockState, world_size: int, *, wait_s: float
) -> Joined:
    """Post this rank's block state and wait (at most `wait_s`) for every rank's."""
    channel.post_block(block, state.report())
    return merge(channel.gather_block(block, time.monotonic() + wait_s), world_size)
