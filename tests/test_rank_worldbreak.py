"""A rank's own world-breaking action, seen where it happens and blamed on that rank.

In-process units of what tests/test_reliability_world_break.py shows through the real CLI: the
audit hook that notices a signal aimed at the torchrun agent, the agreement rule that makes a rank
that destroyed its process group primary, and the root-cause rule that prefers a recorded
`broke_world` over the peers it orphaned. Each with the control that shows it can fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch.distributed as dist

from harness.evidence.collect import RankFiles, find_root_cause
from harness.rank.agreement import LocalResult, agree
from harness.rank.worldbreak import AgentWatch, destroyed_group
from harness.schema.rank_record import RankRecord, TestOutcome, WorldBreak

T = "suites/transport/test_x.py::test_fault"
BEFORE = "suites/transport/test_x.py::test_before"


@pytest.fixture
def agent() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in for the torchrun agent: a sleeping process in its own session."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    yield proc
    proc.kill()
    proc.wait()


def watch(agent_pid: int, seen: list[WorldBreak]) -> AgentWatch:
    return AgentWatch(3, agent_pid, lambda: T, seen.append).install()


def test_a_signal_to_the_agent_is_recorded_before_it_is_sent(
    agent: subprocess.Popen[bytes],
) -> None:
    seen: list[WorldBreak] = []
    guard = watch(agent.pid, seen)
    try:
        os.kill(agent.pid, 0)  # a probe is not a signal
        assert seen == []
        os.kill(agent.pid, signal.SIGTERM)
    finally:
        guard.close()
    assert agent.wait(10) == -signal.SIGTERM
    [broke] = seen
    assert (broke.action, broke.signal, broke.target, broke.test) == (
        "signalled-agent",
        "SIGTERM",
        agent.pid,
        T,
    )
    assert broke.message.startswith(f"rank 3 sent SIGTERM to its torchrun agent (pid {agent.pid})")


def test_a_signal_to_the_agents_process_group_is_recorded(
    agent: subprocess.Popen[bytes],
) -> None:
    seen: list[WorldBreak] = []
    guard = watch(agent.pid, seen)
    try:
        os.killpg(agent.pid, signal.SIGTERM)  # its own session: its pgid is its pid
    finally:
        guard.close()
    [broke] = seen
    assert (broke.signal, broke.target) == ("SIGTERM", -agent.pid)
    assert "process group" in broke.message


def _leader() -> subprocess.Popen[bytes]:
    """A sleeping process leading its own session."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )


@pytest.fixture
def between() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    procs = {"server": _leader(), "helper": _leader(), "bystander": _leader()}
    yield procs
    for proc in procs.values():
        proc.kill()
        proc.wait()


def test_a_signal_to_the_group_of_a_process_between_counts_as_one_to_the_agent(
    agent: subprocess.Popen[bytes], between: dict[str, subprocess.Popen[bytes]]
) -> None:
    """Where a process between a forked rank and its agent leads its own group, the rank's
    `os.killpg(os.getpgid(os.getppid()))` signals that group, as the same call signals the
    agent's group in a cold rank."""
    server, helper = between["server"].pid, between["helper"].pid
    seen: list[WorldBreak] = []
    names = {server: "the forkserver that forked it", helper: "a helper between"}
    guard = AgentWatch(3, agent.pid, lambda: T, seen.append, between=names)
    for pid in (server, helper):
        assert guard.aims_at_agent("os.kill", pid)
        assert guard.aims_at_agent("os.killpg", os.getpgid(pid))
        assert guard.aims_at_agent("os.kill", -os.getpgid(pid))
    # Controls: a group that is none of theirs, and this process's own group, do not count.
    bystander = os.getpgid(between["bystander"].pid)
    for event, target in (("os.killpg", bystander), ("os.kill", -bystander), ("os.killpg", 0)):
        assert not guard.aims_at_agent(event, target), (event, target)
    # Without the processes between, their groups are nobody's.
    bare = AgentWatch(3, agent.pid, lambda: T, seen.append)
    assert not bare.aims_at_agent("os.killpg", server)
    assert not bare.aims_at_agent("os.kill", -helper)

    guard.install()
    try:
        os.killpg(os.getpgid(server), signal.SIGTERM)
    finally:
        guard.close()
    assert between["server"].wait(10) == -signal.SIGTERM
    [broke] = seen
    assert (broke.signal, broke.target) == ("SIGTERM", -server)
    assert "the process group of the forkserver that forked it" in broke.message, broke.message
    assert f"torchrun agent pid {agent.pid}" in broke.message


def test_a_signal_to_another_process_is_not_blamed(agent: subprocess.Popen[bytes]) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    seen: list[WorldBreak] = []
    guard = watch(agent.pid, seen)
    try:
        os.kill(bystander.pid, signal.SIGKILL)
    finally:
        guard.close()
    bystander.wait(10)
    assert seen == []
    assert agent.poll() is None


def test_a_closed_watch_sees_nothing(agent: subprocess.Popen[bytes]) -> None:
    seen: list[WorldBreak] = []
    watch(agent.pid, seen).close()
    os.kill(agent.pid, signal.SIGTERM)
    agent.wait(10)
    assert seen == []


def test_a_group_destroyed_during_the_test_is_a_world_break() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert destroyed_group(2, T, alive_before=True) is None  # still there: nothing broke
    finally:
        dist.destroy_process_group()
    broke = destroyed_group(2, T, alive_before=True)
    assert broke is not None and (broke.action, broke.test) == ("destroyed-process-group", T)
    assert broke.message.startswith(f"rank 2 destroyed its default process group during {T}")
    # A group already gone before the test (an earlier test destroyed it) is not blamed again.
    assert destroyed_group(2, T, alive_before=False) is None


def result(rank: int, seq: int | None, *, broke: bool = False) -> LocalResult:
    return LocalResult(
        rank=rank,
        outcome="failed" if seq is not None else "passed",
        message=f"rank {rank}'s failure",
        fail_seq=seq,
        broke_world=broke,
    )


def test_the_rank_that_destroyed_its_group_is_primary_even_when_a_peer_failed_first() -> None:
    results = {0: result(0, 1), 1: result(1, 2, broke=True)}
    agreement = agree(T, results, 2)
    assert agreement.primary_ranks == (1,) and agreement.message == "rank 1's failure"
    assert agreement.outcome_for(results[0]).primary is False
    # Control: without the structured flag the first failure (the victim) is blamed.
    plain = {0: result(0, 1), 1: result(1, 2)}
    assert agree(T, plain, 2).primary_ranks == (0,)


def test_the_flag_travels_between_ranks() -> None:
    sent = result(1, 2, broke=True)
    assert LocalResult.from_json(sent.to_json()) == sent


def record(rank: int, *, broke: WorldBreak | None = None) -> RankRecord:
    return RankRecord(
        rank=rank,
        world_size=2,
        collected=(BEFORE, T),
        tests=(TestOutcome(BEFORE, "passed"),),
        current_test=T,
        abort_reason="orphaned: the torchrun agent that started this rank is gone",
        broke_world=broke,
    )


def test_the_rank_that_signalled_its_agent_is_the_root_cause_not_the_orphans() -> None:
    broke = WorldBreak("signalled-agent", T, 1.0, "rank 1 sent SIGKILL", "SIGKILL", 42)
    ranks = RankFiles(2, {0: record(0), 1: record(1, broke=broke)})
    cause = find_root_cause(ranks, timed_out=False, torchrun_error=None)
    assert cause is not None
    assert (cause.rank, cause.test, cause.kind, cause.message) == (
        1,
        T,
        "broke-world",
        "rank 1 sent SIGKILL",
    )
    # Control: without the record's `broke_world`, the lowest orphan is blamed.
    plain = RankFiles(2, {0: record(0), 1: record(1)})
    cause = find_root_cause(plain, timed_out=False, torchrun_error=None)
    assert cause is not None and cause.rank == 0


def test_a_lagging_peers_follow_on_at_an_earlier_test_does_not_win() -> None:
    broke = WorldBreak("signalled-agent", T, 1.0, "rank 1 sent SIGKILL", "SIGKILL", 42)
    follow_on = TestOutcome(BEFORE, "error", message="follow-on", primary=False, failing_ranks=(1,))
    lagging = replace(record(0), tests=(follow_on,), current_test=None)
    cause = find_root_cause(
        RankFiles(2, {0: lagging, 1: record(1, broke=broke)}), timed_out=False, torchrun_error=None
    )
    assert cause is not None and (cause.rank, cause.test, cause.kind) == (1, T, "broke-world")
    # Control: a rank's own failure before the break is still the earlier, real cause.
    own = replace(follow_on, primary=True, failing_ranks=(0,), message="rank 0's own failure")
    earlier = replace(record(0), tests=(own,), current_test=None)
    cause = find_root_cause(
        RankFiles(2, {0: earlier, 1: record(1, broke=broke)}), timed_out=False, torchrun_error=None
    )
    assert cause is not None and (cause.rank, cause.test, cause.kind) == (0, BEFORE, "test")


def test_broke_world_survives_the_record_round_trip() -> None:
    broke = WorldBreak("destroyed-process-group", T, 1.5, "rank 1 destroyed it")
    rec = record(1, broke=broke)
    assert RankRecord.from_json(rec.to_json()) == rec
    bad = {**rec.to_json(), "broke_world": {**broke.to_json(), "action": "other"}}
    with pytest.raises(ValueError, match=r"broke_world\.action"):
        RankRecord.from_json(bad)
