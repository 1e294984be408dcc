"""A rank whose own action breaks the world is the root cause, not the peers that suffered it.

Real `dcpqual run` launches at world 2, the fault on rank 1 (the suites' default): a rank that
destroys its default process group mid-test (its peer's collective then fails, often first), and
a rank that SIGKILLs its torchrun agent (every rank is then an orphan its watchdog ends), and,
the ranks being forked by the agent's forkserver, a rank that SIGKILLs the forkserver or its
process group. Each is held to: exit 1, the faulty rank and test as the root cause
with the structured `broke_world` in its record, a bundle `dcpqual verify` accepts, and no
process of the run left. A receipt forged to blame the victim instead (every hash regenerated)
is refused: `verify` re-derives the root cause's rank, test and kind from the records.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from _support.forge import forge
from _support.runs import processes_of_run, receipt, records, run

from harness.cli import main
from harness.evidence import verify

pytestmark = [pytest.mark.torchrun]

FAULT_RANK = 1


def blamed_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suite: str) -> dict:
    monkeypatch.setenv("DCPQUAL_FAULT_RANK", str(FAULT_RANK))
    out = tmp_path / "bundle"
    code, elapsed = run(out, 2, suite, "--test-timeout", "30", "--timeout", "240")
    assert code == 1
    assert elapsed < 120, f"ended after {elapsed:.0f}s"
    data = receipt(out)
    cause = data["root_cause"]
    assert (cause["rank"], cause["kind"]) == (FAULT_RANK, "broke-world"), cause
    assert cause["test"].endswith("::test_fault"), cause
    assert main(["verify", str(out)]) == 0, "dcpqual verify rejects the bundle"
    assert processes_of_run(out) == []
    recs = records(out)
    assert recs[0].broke_world is None, recs[0].broke_world
    broke = recs[FAULT_RANK].broke_world
    assert broke is not None and broke.test.endswith("::test_fault"), broke
    return {"cause": cause, "broke": broke, "records": recs, "out": out}


def blame_the_victim(data: dict[str, Any]) -> None:
    data["root_cause"].update(rank=0, kind="killed", message="rank 0 died")


def test_a_rank_destroying_its_process_group_is_the_root_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = blamed_run(tmp_path, monkeypatch, "rank_destroy_group.py")
    assert found["broke"].action == "destroyed-process-group"
    assert "destroyed its default process group" in found["cause"]["message"]
    [mine] = [t for t in found["records"][FAULT_RANK].tests if t.nodeid.endswith("::test_fault")]
    assert (mine.outcome, mine.primary) == ("failed", True), mine
    [peer] = [t for t in found["records"][0].tests if t.nodeid.endswith("::test_fault")]
    assert not peer.primary and peer.failing_ranks == (FAULT_RANK,), peer


def test_a_rank_killing_its_torchrun_agent_is_the_root_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = blamed_run(tmp_path, monkeypatch, "rank_kill_agent.py")
    broke = found["broke"]
    assert (broke.action, broke.signal) == ("signalled-agent", "SIGKILL"), broke
    assert "SIGKILL" in found["cause"]["message"] and "agent" in found["cause"]["message"]
    # The same bundle, its receipt forged to blame the orphan instead, every hash regenerated.
    forged = tmp_path / "forged"
    shutil.copytree(found["out"], forged)
    forge(forged, blame_the_victim)
    with monkeypatch.context() as patch:  # control: only the re-derivation catches it
        patch.setattr(verify, "rederive_problems", lambda *_: [])
        assert verify.verify_bundle(forged).ok
    result = verify.verify_bundle(forged)
    assert not result.ok
    assert any("root_cause" in p for p in result.problems), result.problems


@pytest.mark.parametrize(
    ("how", "named"),
    [
        ("pid", "the forkserver that forked it"),
        ("group", "its torchrun agent's process group"),
    ],
)
def test_a_forked_rank_killing_the_forkserver_or_its_group_is_the_root_cause(
    how: str, named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a forked rank and its agent stands the agent's forkserver (its parent): killing
    it, or its group (the agent's: a forked rank's `os.killpg(os.getpgid(os.getppid()))`),
    ends the job as killing the agent does, and is blamed the same way."""
    monkeypatch.setenv("DCPQUAL_KILL_HOW", how)
    found = blamed_run(tmp_path, monkeypatch, "rank_kill_between.py")
    broke = found["broke"]
    assert (broke.action, broke.signal) == ("signalled-agent", "SIGKILL"), broke
    assert named in broke.message and "agent pid" in broke.message, broke.message
    assert named in found["cause"]["message"], found["cause"]
