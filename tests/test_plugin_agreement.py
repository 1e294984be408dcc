"""The ranks' shared decisions: one verdict per test, the right primary rank, collection diffs."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from harness.rank.agreement import (
    Agreement,
    LocalResult,
    agree,
    compare_collections,
)

T = "suites/transport/test_x.py::test_combine"


def ok(rank: int, outcome: str = "passed") -> LocalResult:
    return LocalResult(rank=rank, outcome=outcome)  # type: ignore[arg-type]


def fail(rank: int, seq: int, message: str = "boom", kind: str = "ran") -> LocalResult:
    return LocalResult(rank=rank, outcome="failed", kind=kind, message=message, fail_seq=seq)  # type: ignore[arg-type]


def test_all_pass_and_mixed_skips_pass():
    assert agree(T, {r: ok(r) for r in range(4)}, 4).outcome == "passed"
    mixed = {0: ok(0), 1: ok(1, "skipped")}
    assert agree(T, mixed, 2).outcome == "passed"
    assert agree(T, {0: ok(0, "skipped"), 1: ok(1, "skipped")}, 2).outcome == "skipped"


def test_first_failure_by_store_order_is_primary_not_lowest_rank():
    results = {0: fail(0, seq=2, message="gloo: connection closed"), 1: fail(1, seq=1), 2: ok(2)}
    agreement = agree(T, results, 3)
    assert agreement.outcome == "failed"
    assert agreement.primary_ranks == (1,)
    assert agreement.message == "boom"


def test_every_rank_records_the_same_verdict_with_its_own_role():
    results = {0: ok(0), 1: fail(1, seq=1, message="assert 1 != 1"), 2: fail(2, seq=2)}
    agreement = agree(T, results, 3)
    passed_locally = agreement.outcome_for(results[0])
    primary = agreement.outcome_for(results[1])
    follow_on = agreement.outcome_for(results[2])
    assert {o.outcome for o in (passed_locally, primary, follow_on)} == {"failed"}
    assert (passed_locally.primary, primary.primary, follow_on.primary) == (False, True, False)
    assert passed_locally.message == "follow-on: rank 1: assert 1 != 1"
    assert follow_on.message == "[secondary] boom"
    assert all(o.failing_ranks == (1,) for o in (passed_locally, primary, follow_on))


def test_a_rank_that_never_reported_is_primary_and_agreement_is_incomplete():
    agreement = agree(T, {0: fail(0, seq=1, message="connection closed by peer"), 2: ok(2)}, 3)
    assert agreement.primary_ranks == (1,)
    assert agreement.missing_ranks == (1,)
    assert not agreement.complete
    assert agreement.outcome_for(ok(2)).agreed is False


def test_aborted_ranks_are_never_primary_when_a_real_failure_exists():
    aborted = LocalResult(rank=0, outcome="error", kind="aborted", message="aborted")
    agreement = agree(T, {0: aborted, 1: fail(1, seq=1)}, 2)
    assert agreement.primary_ranks == (1,)
    assert agreement.outcome_for(aborted).primary is False


def timeout(rank: int, in_collective: bool, seqs: dict[str, int]) -> LocalResult:
    return LocalResult(
        rank=rank,
        outcome="failed",
        kind="timeout",
        message=f"timed out on {rank}",
        fail_seq=rank + 1,
        in_collective=in_collective,
        seqs=seqs,
    )


def test_timeout_blames_the_rank_outside_collectives():
    results = {
        0: timeout(0, True, {"0": 5}),
        1: timeout(1, False, {"0": 4}),
        2: timeout(2, True, {"0": 5}),
    }
    agreement = agree(T, results, 3)
    assert agreement.primary_ranks == (1,)
    assert agreement.message == "timed out on 1"


def test_timeout_inside_collectives_blames_the_rank_whose_sequence_lags():
    results = {
        0: timeout(0, True, {"0": 7, "1": 2}),
        1: timeout(1, True, {"0": 7, "1": 1}),  # never reached the group-1 collective
        2: timeout(2, True, {"0": 7, "2": 2}),
        3: ok(3),
    }
    assert agree(T, results, 4).primary_ranks == (1,)


def test_timeout_without_any_clue_blames_every_timed_out_rank():
    results = {0: timeout(0, True, {"0": 3}), 1: timeout(1, True, {"0": 3})}
    assert agree(T, results, 2).primary_ranks == (0, 1)


def test_an_ordinary_failure_beats_later_timeouts():
    results = {0: timeout(0, True, {"0": 3}), 1: fail(1, seq=9)}
    assert agree(T, results, 2).primary_ranks == (1,)


def test_local_result_round_trips_through_json_and_the_wire():
    res = timeout(3, True, {"0": 4, "default_pg": 2})
    assert LocalResult.from_json(res.to_json()) == res
    assert LocalResult.from_wire(res.to_wire()) == res
    assert LocalResult.from_wire(res.to_wire().encode()) == res  # as the store hands it back


@pytest.mark.parametrize(
    "change",
    [{"extra": 1}, {"outcome": "exploded"}, {"rank": -1}, {"kind": "lost"}, {"seqs": {"0": "x"}}],
    ids=["unknown-key", "outcome", "rank", "kind", "seqs"],
)
def test_a_peer_result_that_is_not_a_local_result_is_refused(change):
    wire = json.loads(ok(1).to_wire())
    with pytest.raises(ValidationError):
        LocalResult.from_wire(json.dumps({**wire, **change}))


def test_passing_agreement_keeps_local_outcome():
    agreement = Agreement(T, "passed")
    assert agreement.outcome_for(ok(0, "skipped")).outcome == "skipped"


def test_same_collections_agree():
    ids = ["a::x", "a::y"]
    assert compare_collections({0: ids, 1: list(ids), 2: list(ids)}) is None


@pytest.mark.parametrize("odd", [0, 2])
def test_collection_mismatch_names_the_odd_rank_with_a_diff(odd):
    ids = ["a::x", "a::y"]
    lists = {r: list(ids) for r in range(4)}
    lists[odd] = [*ids, "a::only_here"]
    mismatch = compare_collections(lists)
    assert mismatch is not None
    assert mismatch.odd_ranks == (odd,)
    assert mismatch.reference_rank == (1 if odd == 0 else 0)
    assert "+a::only_here" in mismatch.diff
    assert f"rank(s) {odd} differ" in mismatch.describe()


def test_collection_order_matters():
    mismatch = compare_collections({0: ["a", "b"], 1: ["b", "a"], 2: ["a", "b"]})
    assert mismatch is not None and mismatch.odd_ranks == (1,)


@pytest.mark.parametrize("peers", ["passed", "skipped"])
def test_an_error_on_one_rank_fails_the_agreed_outcome(peers):
    """A setup or teardown error is failing like a failure: a peer's pass cannot outvote it."""
    results = {0: ok(0, peers), 1: LocalResult(rank=1, outcome="error", message="setup broke")}
    verdict = agree(T, results, 2)
    assert (verdict.outcome, verdict.primary_ranks, verdict.failed) == ("error", (1,), True)
    assert verdict.outcome_for(results[0]).outcome == "error"  # the follow-on rank too
