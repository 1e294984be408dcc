"""When ranks are stopped: blame the rank that died, and keep the failure that explains the run.

When a rank dies mid-test, its peers' gloo collective raises "Connection closed by peer" at once,
and torchrun SIGTERMs them a moment later. If a survivor's test body finished (with that error)
before the SIGTERM reached its watchdog, its record has no outcome for the test, just like the
dead rank's: both look "killed while running" the same test, and before the fix the lower rank
won the tie. That race made the real-run fault tests flaky under load (the SIGKILL of rank 13 of
16 was blamed on a survivor). Here the two records are written as the race leaves them.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from _support.evidence_factory import NODES, context, failed, passed, torchrun_logs, write_rank
from _support.watchdog import NODEID, SigtermPipe, World, make, record

from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle
from harness.rank.watchdog import EXIT_TERMINATED
from harness.schema.rank_record import RankRecord, rank_record_path

SIGTERM_REASON = "received SIGTERM (torchrun stopped the job or it was cancelled)"


def stopped_in(out: Path, rank: int, nranks: int, *, reason: str | None) -> None:
    """Rank `rank` passed the first test and ended inside the second, with or without words."""
    write_rank(out, rank, nranks, tests=[passed(NODES[0])], captures=[], complete=False)
    path = rank_record_path(out / "records", rank)
    if reason is not None:
        replace(RankRecord.read(path), abort_reason=reason, abort_primary=False).write(path)


def test_the_rank_that_died_is_blamed_not_the_lower_ranks_torchrun_stopped(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    nranks, dead = 4, 3
    for rank in range(nranks):
        stopped_in(out, rank, nranks, reason=None if rank == dead else SIGTERM_REASON)
    torchrun_logs(out, nranks)
    receipt = finalize_bundle(out, context(nranks, exit_code=1))

    cause = receipt.root_cause
    assert cause is not None and cause.kind == "killed"
    assert (cause.rank, cause.test) == (dead, NODES[1]), cause
    assert SIGTERM_REASON not in cause.message
    assert receipt.ranks.killed == [0, 1, 2, 3]  # none finished; only one died on its own
    assert receipt.ranks.stopped == [0, 1, 2]  # ... and the others say so
    summary = (out / "summary.md").read_text()
    assert "did not finish: 0, 1, 2 and 3 (stopped by the run's fault: 0, 1 and 2)" in summary
    assert verify_bundle(out).ok


def test_ranks_all_stopped_alike_are_still_blamed_lowest_first(tmp_path: Path) -> None:
    """The whole run cancelled (every rank got SIGTERM): nothing tells them apart."""
    out = tmp_path / "bundle"
    for rank in range(2):
        stopped_in(out, rank, 2, reason=SIGTERM_REASON)
    torchrun_logs(out, 2)
    cause = finalize_bundle(out, context(2, exit_code=1)).root_cause
    assert cause is not None and (cause.rank, cause.test) == (0, NODES[1])
    assert SIGTERM_REASON in cause.message


# -- a rank stopped while agreeing on its own failure keeps it --------------------------------


def test_sigterm_while_agreeing_keeps_the_outcome_the_rank_is_about_to_record(
    watchdog_world: World,
    sigterm_pipe: SigtermPipe,
) -> None:
    """The failing rank is agreeing with its peers when torchrun's SIGTERM arrives (the peers,
    stuck in a collective it never joined, were aborted and exited first). Its own failure is
    the run's root cause: the watchdog must let the main thread record it before sealing the
    record, not seal it at once and lose the one message that explains the run."""
    out, chans, keeper = watchdog_world
    dog, exits = make(watchdog_world, wakeup_fd=sigterm_pipe.read_fd, test_timeout_s=60)
    dog.begin_test(0, NODEID)
    assert dog.body_done()  # the test failed on this rank; agreement under way
    sigterm_pipe.send()
    time.sleep(0.3)  # the main thread gets the peers' results a moment later
    keeper.add_test(failed(NODEID, "AssertionError: the real cause"))
    dog.idle()
    assert exits.done.wait(10)
    assert exits.codes == [EXIT_TERMINATED]
    rec = record(out)
    assert [(t.outcome, t.primary, t.message) for t in rec.tests] == [
        ("failed", True, "AssertionError: the real cause")
    ]
    assert "SIGTERM" in (rec.abort_reason or "") and not rec.complete
    assert chans[1].aborted(), "peers still waiting on this rank were told at once"
