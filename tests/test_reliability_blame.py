"""Blame when a rank dies: the rank that died, never a survivor torchrun stopped because of it.

When a rank dies mid-test, its peers' gloo collective raises "Connection closed by peer" at once,
and torchrun SIGTERMs them a moment later. If a survivor's test body finished (with that error)
before the SIGTERM reached its watchdog, its record has no outcome for the test, just like the
dead rank's: both look "killed while running" the same test, and before the fix the lower rank
won the tie. That race made the real-run fault tests flaky under load (the SIGKILL of rank 13 of
16 was blamed on a survivor). Here the two records are written as the race leaves them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from test_evidence_factory import NODES, context, passed, torchrun_logs, write_rank

from harness.dist.records import RankRecord, rank_record_path
from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle

SIGTERM_REASON = "received SIGTERM (torchrun stopped the job or it was cancelled)"


def stopped_in(out: Path, rank: int, world: int, *, reason: str | None) -> None:
    """Rank `rank` passed the first test and ended inside the second, with or without words."""
    write_rank(out, rank, world, tests=[passed(NODES[0])], captures=[], complete=False)
    path = rank_record_path(out / "records", rank)
    if reason is not None:
        replace(RankRecord.read(path), abort_reason=reason, abort_primary=False).write(path)


def test_the_rank_that_died_is_blamed_not_the_lower_ranks_torchrun_stopped(tmp_path):
    out = tmp_path / "bundle"
    world, dead = 4, 3
    for rank in range(world):
        stopped_in(out, rank, world, reason=None if rank == dead else SIGTERM_REASON)
    torchrun_logs(out, world)
    receipt = finalize_bundle(out, context(world, exit_code=1))

    cause = receipt.root_cause
    assert cause is not None and cause.kind == "killed"
    assert (cause.rank, cause.test) == (dead, NODES[1]), cause
    assert SIGTERM_REASON not in cause.message
    assert receipt.ranks.killed == [0, 1, 2, 3]  # none finished; only one died on its own
    assert verify_bundle(out).ok


def test_ranks_all_stopped_alike_are_still_blamed_lowest_first(tmp_path):
    """The whole run cancelled (every rank got SIGTERM): nothing tells them apart."""
    out = tmp_path / "bundle"
    for rank in range(2):
        stopped_in(out, rank, 2, reason=SIGTERM_REASON)
    torchrun_logs(out, 2)
    cause = finalize_bundle(out, context(2, exit_code=1)).root_cause
    assert cause is not None and (cause.rank, cause.test) == (0, NODES[1])
    assert SIGTERM_REASON in cause.message
