"""Sub-world placement: which ranks run which case, the order that makes a block, and the join
that lets every rank stop at the same place."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.rank.agreement import LocalResult, agree
from harness.rank.subworld import (
    BlockReport,
    BlockState,
    Lane,
    join,
    lanes_for,
    merge,
    plan,
    size_of,
)
from harness.schema.rank_record import SubworldBlock, SubworldLane

TRANSPORT = [("transport", size) for size in (2, 4, 16) * 3]


def test_sixteen_ranks_run_dcp2_on_ranks_0_to_7_and_dcp4_on_8_to_15() -> None:
    lanes = lanes_for([2, 4, 16, 2], 16)
    assert lanes == {2: Lane(2, tuple(range(8))), 4: Lane(4, tuple(range(8, 16)))}
    assert lanes[4].describe() == "ranks 8-15 (groups of 4)"


@pytest.mark.parametrize(
    ("sizes", "world"),
    [
        ([2], 16),  # one size: nothing to run beside it
        ([2, 4], 4),  # 4 is the world: only one sub-world size
        ([2, 4, 8], 16),  # three lanes of 16/3 ranks do not exist
        ([4, 8], 8),  # 8 is the world
    ],
)
def test_sizes_that_cannot_share_the_world_keep_running_on_all_of_it(sizes, world) -> None:
    assert lanes_for(sizes, world) is None


def test_a_lane_must_be_whole_groups_of_its_size() -> None:
    assert lanes_for([2, 8], 8) is None  # lanes of 4 ranks cannot hold a group of 8
    assert lanes_for([2, 4], 8) == {2: Lane(2, (0, 1, 2, 3)), 4: Lane(4, (4, 5, 6, 7))}


def test_the_plan_moves_the_placed_cases_to_the_front_of_their_suite_in_order() -> None:
    cases = [("capture", None), *TRANSPORT, ("warmup", None)]
    order, subworld = plan(cases, 16)
    assert sorted(order) == list(range(len(cases)))  # a permutation: no case lost
    sizes = [cases[i][1] for i in order]
    assert sizes == [None, 2, 4, 2, 4, 2, 4, 16, 16, 16, None]
    assert order[1:7] == [1, 2, 4, 5, 7, 8]  # relative order kept
    assert {p: subworld.lane_of(p).size for p in range(1, 7)} == {
        1: 2,
        2: 4,
        3: 2,
        4: 4,
        5: 2,
        6: 4,
    }
    assert subworld.lane_of(0) is None and subworld.lane_of(7) is None
    assert subworld.block_ending_at(6) == 0 and subworld.block_size(0) == 6
    assert [subworld.block_ending_at(p) for p in range(11)].count(None) == 10
    assert subworld.record_blocks() == (
        SubworldBlock(
            0,
            (
                SubworldLane(2, tuple(range(8)), cases=3),
                SubworldLane(4, tuple(range(8, 16)), cases=3),
            ),
        ),
    )


def test_at_four_ranks_the_order_and_the_world_are_what_they_were() -> None:
    cases = [("capture", None), *TRANSPORT]
    order, subworld = plan(cases, 4)
    assert order == list(range(len(cases)))
    assert not subworld.lanes and not subworld.block_ends


def test_each_suite_is_planned_on_its_own() -> None:
    cases = [("a", 2), ("a", 4), ("b", 2), ("b", 4), ("b", None)]
    _, subworld = plan(cases, 8)
    assert [subworld.block_ending_at(p) for p in range(5)] == [None, 0, None, 1, None]


def test_the_marker_names_the_group_size() -> None:
    def item(*args, **kwargs):
        marker = SimpleNamespace(args=args, kwargs=kwargs)
        return SimpleNamespace(
            get_closest_marker=lambda name: marker if name == "subworld" else None
        )

    assert size_of(item(size=4)) == 4
    assert size_of(item(2)) == 2
    assert size_of(SimpleNamespace(get_closest_marker=lambda name: None)) is None
    with pytest.raises(ValueError, match="positive group size"):
        size_of(item())


def test_a_lane_agrees_with_its_own_ranks_only() -> None:
    lane = (8, 9, 10, 11)
    results = {r: LocalResult(rank=r, outcome="passed") for r in lane}
    assert agree("t", results, 16, lane).complete
    del results[10]
    agreement = agree("t", results, 16, lane)
    assert agreement.missing_ranks == (10,) and agreement.primary_ranks == (10,)
    # Without the lane, the ranks that did not run the case would be blamed for it.
    assert agree("t", {r: LocalResult(rank=r, outcome="passed") for r in lane}, 16).missing_ranks


def test_a_lane_stops_at_its_failure_only_when_maxfail_is_reached() -> None:
    state = BlockState()
    assert not state.lane_stopped(0, 1)
    state.note_failure(3, hard=False)
    assert state.lane_stopped(0, 1)
    assert not state.lane_stopped(0, 2) and state.lane_stopped(1, 2)
    assert not state.lane_stopped(5, 0)  # 0: never stop early
    hard = BlockState()
    hard.note_failure(4, hard=True)
    assert hard.lane_stopped(0, 0)


def test_the_join_gives_every_rank_the_same_stop() -> None:
    posted = {0: BlockReport(), 1: BlockReport(failed=(5,))}
    joined = merge({**posted, 2: BlockReport(failed=(5, 2))}, 3)
    assert joined.failed == (2, 5) and not joined.missing
    assert joined.stop(0, 2) and not joined.stop(0, 3) and joined.stop(1, 3)
    assert not joined.stop(9, 0)
    clean = merge({r: BlockReport() for r in range(3)}, 3)
    assert not clean.stop(0, 1)
    assert merge(posted, 3).missing == (2,) and merge(posted, 3).stop(0, 0)
    assert merge({0: BlockReport(hard=True)}, 1).stop(0, 0)


def test_join_posts_this_ranks_failures_and_reads_everyones() -> None:
    class Channel:
        def __init__(self) -> None:
            self.store: dict[int, BlockReport] = {1: BlockReport(failed=(7,))}

        def post_block(self, block: int, report: BlockReport) -> None:
            assert block == 3
            self.store[0] = report

        def gather_block(self, block: int, deadline: float) -> dict[int, BlockReport]:
            return dict(self.store)

    state = BlockState()
    state.note_failure(2, hard=False)
    channel = Channel()
    joined = join(channel, 3, state, 2, wait_s=1.0)
    assert channel.store[0] == BlockReport(failed=(2,), hard=False)
    assert joined.failed == (2, 7) and joined.missing == ()
