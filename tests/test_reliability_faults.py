"""Faults injected into real `dcpqual run` launches: contained, attributed, verifiable.

One launch per fault, world 4 (the SIGKILL case also at 16, `sixteen_ranks`), with a misbehaving
rank other than the suites' default (`DCPQUAL_FAULT_RANK`), so attributing it is never luck. Every
fault is held to `assert_contained`: exit 1, over well before gloo's 30-minute default (a hang:
by the per-test timeout, not the whole-run one), a `fail` receipt whose root cause names the
faulty rank and test, every rank's record in the bundle with what it finished before the fault,
a bundle `dcpqual verify` accepts, and no process of the run alive afterwards, found by the run's
out folder in a process's command line *or environment* (so a helper a rank started, whose
command line names nothing, is found too).

Not asserted: which survivors end with a complete record. Once one rank exits non-zero,
torchrun SIGTERMs the rest, and a survivor that was between its test and the end of its session
is stopped there; that timing is the scheduler's (the receipt's `ranks.killed` lists them too,
and `ranks.stopped` those whose record says they were stopped).

The assertion and `os._exit` faults are launched here only; the world-2 plain hang and
collection-mismatch faults live in tests/test_run_torchrun.py.

Shown to fail when the protection is removed (bottom of the file, in-process): the launcher's
final kill of the process tree, and the rank watchdog's per-test timeout.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from _support.fake_agent import fake_plan
from _support.runs import assert_fault, processes_of_run, records, run
from _support.watchdog import NODEID, World, make, record

from harness.cli import main
from harness.evidence.collect import in_progress
from harness.launch import ending
from harness.launch.launcher import launch
from harness.launch.proctree import Tracker, identify
from harness.rank.watchdog import EXIT_FAILED, Watchdog
from harness.schema.rank_record import RankRecord, TestOutcome

TEST_TIMEOUT_S = 4  # the per-test timeout the hang case runs with


def fault_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    suite: str,
    fault_rank: int,
    *extra: str,
    nranks: int = 4,
) -> tuple[Path, int, float]:
    monkeypatch.setenv("DCPQUAL_FAULT_RANK", str(fault_rank))
    out = tmp_path / f"{Path(suite).stem}-w{nranks}-r{fault_rank}"
    code, elapsed = run(out, nranks, suite, *extra)
    return out, code, elapsed


def assert_contained(
    out: Path, code: int, elapsed: float, *, rank: int, nranks: int, test: str = "test_fault"
) -> tuple[dict[str, Any], dict[int, RankRecord]]:
    """What every injected fault must leave: see the module docstring."""
    data = assert_fault(out, code, elapsed, rank=rank, test=test)  # also: nothing left running
    assert main(["verify", str(out)]) == 0, "dcpqual verify rejects the fault's bundle"
    recs = records(out)
    assert sorted(recs) == list(range(nranks)), "a rank's record is missing from the bundle"
    for r, rec in recs.items():
        assert rec.tests[0].nodeid.endswith("::test_before"), (r, rec.tests)
        assert rec.tests[0].outcome == "passed", (r, rec.tests[0])
    assert not any(t.nodeid.endswith("::test_after") for rec in recs.values() for t in rec.tests)
    return data, recs


def fault_of(rec: RankRecord) -> TestOutcome:
    [test] = [t for t in rec.tests if t.nodeid.endswith("::test_fault")]
    return test


@pytest.mark.torchrun
def test_a_rank_raising_fails_every_rank_with_it_as_root_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, code, elapsed = fault_run(tmp_path, monkeypatch, "rank_assert.py", 2)
    data, recs = assert_contained(out, code, elapsed, rank=2, nranks=4)
    assert data["root_cause"]["kind"] == "test"
    assert "injected assertion on rank 2" in data["root_cause"]["message"]
    assert (fault_of(recs[2]).outcome, fault_of(recs[2]).primary) == ("failed", True)
    for r in (0, 1, 3):  # stuck in an all_reduce rank 2 never joins: aborted by their watchdog
        assert not fault_of(recs[r]).primary and fault_of(recs[r]).failing_ranks == (2,)
        assert "rank(s) 2 failed it" in (recs[r].abort_reason or ""), recs[r].abort_reason


@pytest.mark.torchrun
def test_a_rank_calling_os_exit_is_recorded_killed_and_the_root_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, code, elapsed = fault_run(tmp_path, monkeypatch, "rank_exit.py", 3)
    data, recs = assert_contained(out, code, elapsed, rank=3, nranks=4)
    assert data["root_cause"]["kind"] == "killed"
    assert 3 in data["ranks"]["killed"] and 3 not in data["ranks"]["stopped"]
    dead = recs[3]
    assert not dead.complete and dead.abort_reason is None  # died without last words
    # Its record names the test it died in: the first it collected and reported no outcome for.
    assert (in_progress(dead) or "").endswith("::test_fault")
    for r in (0, 1, 2):  # stopped by torchrun's SIGTERM, or ended its session at the failure
        survivor = recs[r]
        stopped_at_failure = survivor.complete and fault_of(survivor).outcome != "passed"
        assert survivor.abort_reason or stopped_at_failure, f"rank {r} does not say why it stopped"


@pytest.mark.parametrize(
    ("nranks", "fault_rank"),
    [(4, 0), pytest.param(16, 13, marks=pytest.mark.sixteen_ranks, id="16-13")],
    ids=["4-0", "16-13"],
)
@pytest.mark.torchrun
def test_a_sigkilled_rank_is_recorded_killed_and_leaves_nothing_running(
    nranks: int, fault_rank: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rank_sigkill.py: the rank starts a helper in its own session, then SIGKILLs itself.

    Checked by hand with the launcher's final kill (`launch`: `if leftovers: tracker.end_all`)
    removed: the helper survives the run and `processes_of_run` names it (and see
    `test_without_the_launchers_final_kill_an_orphan_outlives_the_run`)."""
    out, code, elapsed = fault_run(
        tmp_path, monkeypatch, "rank_sigkill.py", fault_rank, nranks=nranks
    )
    data, recs = assert_contained(out, code, elapsed, rank=fault_rank, nranks=nranks)
    assert data["root_cause"]["kind"] == "killed"
    assert fault_rank in data["ranks"]["killed"]
    dead = recs[fault_rank]
    assert not dead.complete and dead.abort_reason is None
    assert (in_progress(dead) or "").endswith("::test_fault")
    # The orphaned helper outlived torchrun and was ended by the launcher (reported, not hidden).
    leftovers = data["run"]["extra"]["launch"]["leftovers"]
    assert len(leftovers) == 1 and identify(leftovers[0]) is None, leftovers
    assert data["failures"][-1].startswith(
        f"1 process was still running after torchrun exited (pids {leftovers[0]})"
    ), data["failures"]


@pytest.mark.torchrun
def test_a_rank_hung_in_a_collective_is_ended_by_the_per_test_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ended by the rank watchdog's per-test timeout (`Watchdog._run`: `timeout > 0 and now -
    started > timeout` -> `_on_timeout`). Checked by hand with that branch removed: the peers
    give up on rank 2 only at their agreement deadline (timeout + 15 s), torchrun then stops it,
    and the root cause becomes "never reported a result" instead of the timeout: this fails."""
    extra = ("--timeout", "60", "--test-timeout", str(TEST_TIMEOUT_S))
    out, code, elapsed = fault_run(tmp_path, monkeypatch, "rank_hang_collective.py", 2, *extra)
    data, recs = assert_contained(out, code, elapsed, rank=2, nranks=4)
    assert data["run"]["timed_out"] is False, "ended by the whole-run timeout, not the per-test one"
    cause = data["root_cause"]["message"]
    assert re.search(r"timed out after \d+s, blocked inside a torch.distributed call", cause)
    assert "stacks/rank-02.txt" in cause
    hung = (out / "stacks" / "rank-02.txt").read_text()
    assert "rank_hang_collective.py" in hung and "all_reduce" in hung
    assert sorted(p.name for p in (out / "stacks").iterdir()) == [
        f"rank-0{r}.txt" for r in range(4)
    ]  # the peers dumped theirs too, when they learned of the timeout
    assert 2 in data["ranks"]["killed"]  # ended by its watchdog, mid-test
    for r in (0, 1, 3):
        assert fault_of(recs[r]).failing_ranks == (2,), (r, fault_of(recs[r]))


@pytest.mark.torchrun
def test_ranks_disagreeing_on_a_transport_signature_all_fail_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank raises SignatureMismatchError at once; whichever was first is the root cause."""
    out, code, elapsed = fault_run(tmp_path, monkeypatch, "rank_signature.py", 2)
    first = json.loads((out / "receipt.json").read_text())["root_cause"]["rank"]
    data, recs = assert_contained(out, code, elapsed, rank=first, nranks=4)
    assert "disagree on transport signatures" in data["root_cause"]["message"]
    for r, rec in recs.items():
        fault = fault_of(rec)
        assert fault.outcome == "failed" and fault.agreed, (r, fault)
        assert "SignatureMismatchError" in (fault.message or ""), (r, fault.message)
        assert "ranks [2]: 8 heads x 24 -> 16 (fp16" in (fault.message or ""), (r, fault.message)


# -- the protections, removed, let the fault through ------------------------------------------


def test_without_the_launchers_final_kill_an_orphan_outlives_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check `processes_of_run(out) == []` above can fail: a stand-in agent leaves a child
    behind in its own session; with `Tracker.end_all` and `ending.sweep` (the launcher's kills)
    patched away it survives the launch and `processes_of_run` finds it, by its environment
    alone."""
    plan, pidfile = fake_plan(tmp_path, "exit", timeout_s=60)
    monkeypatch.setattr(Tracker, "end_all", lambda self, grace_s: [])
    monkeypatch.setattr(ending, "sweep", lambda *args, **kwargs: set())  # and its repeated kill
    # The run's cgroup is a further line that would still end the child; this is about the first.
    monkeypatch.setattr(ending.Cgroup, "create", classmethod(lambda cls: None))
    launch(plan, tick_s=0.05)
    child = int(pidfile.read_text())
    try:
        leftover = processes_of_run(plan.out_dir)
        assert [line.split(":")[0] for line in leftover] == [str(child)]
        assert str(plan.out_dir) not in leftover[0], "found by its command line, not its env"
    finally:
        os.kill(child, signal.SIGKILL)


def test_without_the_per_test_timeout_a_hang_is_never_ended(
    watchdog_world: World,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watchdog that ends the hung rank above, in-process: with its timeout handler
    patched away, a test past its timeout is left running, with no dump and no record."""
    out, _, _ = watchdog_world
    monkeypatch.setattr(Watchdog, "_on_timeout", lambda self, index, nodeid, elapsed: None)
    dog, exits = make(watchdog_world, test_timeout_s=0.2)
    dog.begin_test(0, NODEID)
    assert not exits.done.wait(1.0)
    assert exits.codes == [] and EXIT_FAILED not in exits.codes
    assert not (out / "stacks").exists() and record(out).tests == ()
    dog.stop()
