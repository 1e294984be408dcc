"""`dcpqual run` for real: torchrun, gloo ranks, the rank plugin, the evidence bundle.

Small worlds (2-4 ranks) on tiny suites from tests/rank_suites. Each injected fault must end the
run non-zero, with the right root-cause rank and test in the receipt, quickly (far below gloo's
30-minute default timeout), and with no process of the run left alive.
"""

from __future__ import annotations

import json
import os

import pytest
from _support.hash_probe import probe_under
from _support.runs import (
    FAST_S,
    Launched,
    assert_fault,
    preload_left_a_thread,
    processes_of_run,
    receipt,
    records,
    run,
    two_nodes,
)

from harness.cli import main
from harness.launch.agent import STARTED_FRESH, cold_reason
from harness.rank.forkserver_preload import READY_LINE

pytestmark = [pytest.mark.torchrun]


def test_all_ranks_pass_and_the_bundle_verifies(tmp_path, capsys):
    out = tmp_path / "pass"
    code, _ = run(out, 4, "rank_pass.py")
    assert "started cold" not in capsys.readouterr().out  # forked: nothing to explain
    assert code == 0, (out / "summary.md").read_text() if (out / "summary.md").exists() else ""
    data = receipt(out)
    assert data["verdict"] == "pass" and data["root_cause"] is None
    recs = records(out)
    assert sorted(recs) == [0, 1, 2, 3]
    assert all(r.complete and r.abort_reason is None for r in recs.values())
    assert len({tuple((t.nodeid, t.outcome) for t in r.tests) for r in recs.values()}) == 1
    assert [t.outcome for t in recs[0].tests].count("passed") == 7
    assert sorted(p.name for p in (out / "junit").glob("rank-*.xml")) == [
        f"rank-0{r}.xml" for r in range(4)
    ]
    assert main(["verify", str(out)]) == 0
    assert processes_of_run(out) == []
    assert data["run"]["extra"]["launch"]["zygote"] is None
    assert all(r.start is not None and r.start.forked for r in recs.values())  # by the agent
    (seeds,) = data["hash_seeds"]  # one seed for the node's ranks, which they record
    assert (seeds["node"], seeds["ranks"]) == (0, [0, 1, 2, 3]), seeds
    drawn = any(line.startswith("hash-seed: ") for line in data["limitations"])
    assert drawn == seeds["drawn"] == ("PYTHONHASHSEED" not in os.environ), data["limitations"]


def test_a_preload_that_left_a_thread_leaves_the_ranks_cold_says_why_and_shares_their_seed(
    tmp_path, monkeypatch, capsys
):
    """A thread alive after the preload, in the agent and then in the fresh forkserver it
    starts, which must not fork either: no failure, torchrun starts the ranks cold, the console
    and the agent's log say why, the records how, and the cold ranks share the launcher's
    drawn seed as forked ones would."""
    preload_left_a_thread(monkeypatch)
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    out = tmp_path / "cold"
    code, _ = run(out, 2, "rank_pass.py")
    assert code == 0
    data = receipt(out)
    starts = [r.start for r in records(out).values() if r.start is not None]
    assert len(starts) == 2 and not any(s.forked for s in starts), starts
    log = out / "torchrun" / "node-00" / "agent.log"
    assert f"{STARTED_FRESH}2 threads alive in the agent after its preload" in log.read_text()
    why = cold_reason(log)
    assert why is not None and why.startswith("2 threads alive in the forkserver"), why
    assert f"dcpqual run: ranks started cold, not forked: {why}\n" in capsys.readouterr().out
    (seed,) = {s.hash_seed for s in starts}  # cold, with the one seed of the node
    assert seed is not None and {s.hash_probe for s in starts} == {probe_under(seed)}
    assert [s["ranks"] for s in data["hash_seeds"]] == [[0, 1]]
    assert any(line.startswith("hash-seed: ") for line in data["limitations"])
    assert main(["verify", str(out)]) == 0
    assert processes_of_run(out) == []


def test_a_thread_alive_in_the_agent_alone_gives_a_fresh_forkserver_that_forks_the_ranks(
    tmp_path, monkeypatch, capsys
):
    """The agent forks its forkserver only with one thread alive; with more, the server is a
    fresh interpreter that preloads for itself and, single-threaded, forks the ranks."""
    preload_left_a_thread(monkeypatch, where="agent")
    out = tmp_path / "fresh"
    code, _ = run(out, 2, "rank_pass.py")
    assert code == 0
    assert all(r.start is not None and r.start.forked for r in records(out).values())
    log = (out / "torchrun" / "node-00" / "agent.log").read_text()
    assert f"{STARTED_FRESH}2 threads alive in the agent after its preload" in log
    assert len(READY_LINE.findall(log)) == 2, log  # the agent's preload, then the server's own
    assert "started cold" not in capsys.readouterr().out


def test_a_hang_is_ended_by_the_per_test_timeout_with_stack_dumps(tmp_path):
    out = tmp_path / "hang"
    code, elapsed = run(out, 2, "rank_hang.py", "--test-timeout", "4")
    assert_fault(out, code, elapsed, rank=1, test="test_fault")
    stacks = (out / "stacks" / "rank-01.txt").read_text()
    assert "rank_hang.py" in stacks and "test_fault" in stacks
    assert (out / "stacks" / "rank-00.txt").exists()
    assert not (out / "logs" / "rank-01.stacks").exists()  # one dump per rank, one name
    recs = records(out)
    [hung] = [t for t in recs[1].tests if t.nodeid.endswith("::test_fault")]
    assert hung.primary and "not inside a torch.distributed call" in (hung.message or "")


def test_ranks_that_collect_different_tests_all_abort_with_a_diff(tmp_path):
    out = tmp_path / "collect"
    code, elapsed = run(out, 2, "rank_collect.py")
    assert code == 1 and elapsed < FAST_S
    assert processes_of_run(out) == []
    assert receipt(out)["root_cause"]["rank"] == 1
    recs = records(out)
    assert all("collected different tests" in (r.abort_reason or "") for r in recs.values())
    assert [r.abort_primary for r in (recs[0], recs[1])] == [False, True]
    log = "".join(p.read_text() for p in (out / "torchrun").rglob("stderr.log"))
    assert "+tests/rank_suites/rank_collect.py::test_only_on_the_fault_rank" in log


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """Two `dcpqual run` agents of 2 ranks each, as on two hosts (one rendezvous, one `--out`),
    running rank_pass.py (collectives across both nodes) and, uncaptured, rank_whoami.py (each
    rank prints its global and local rank): one job, one bundle, its logs read by global rank."""
    out = tmp_path_factory.mktemp("two-nodes") / "2x2"
    codes = two_nodes(out, 2, "rank_pass.py", "rank_whoami.py", uncaptured=True)
    return Launched(codes, out)


def test_two_agents_form_one_job_and_node0_writes_one_bundle(two_node_run: Launched):
    out = two_node_run.out
    assert two_node_run.codes == (0, 0)
    data = receipt(out)
    assert data["verdict"] == "pass"
    assert data["geometry"]["world_size"] == 4 and data["geometry"]["nnodes"] == 2
    recs = records(out)
    assert sorted(recs) == [0, 1, 2, 3] and {r.node_rank for r in recs.values()} == {0, 1}
    assert sorted(p.name for p in (out / "torchrun").iterdir()) == ["node-00", "node-01"]
    assert {"launch.json", "nodes/node-00.json", "nodes/node-01.json"} <= set(data["files"])
    kept = {k: json.loads((out / "nodes" / f"node-0{k}.json").read_text()) for k in (0, 1)}
    assert data["run"]["extra"]["nodes"] == {str(k): m for k, m in kept.items()}
    assert processes_of_run(out) == []


def test_logs_of_a_two_node_job_are_read_by_global_rank(two_node_run: Launched, capsys):
    out = two_node_run.out
    assert two_node_run.codes == (0, 0)
    assert sorted(p.name for p in (out / "logs").iterdir()) == [
        f"rank-{r:02d}.{s}" for r in range(4) for s in ("stderr", "stdout")
    ]
    capsys.readouterr()
    for rank in range(4):
        assert main(["logs", str(out), "--rank", str(rank), "--grep", "whoami:"]) == 0
        [line] = capsys.readouterr().out.splitlines()
        assert line.endswith(f"whoami: global rank {rank} local rank {rank % 2}"), line
        assert main(["logs", str(out), "--rank", str(rank), "--stderr", "--grep", "whoami"]) == 0
        assert capsys.readouterr().out.rstrip().endswith(f"whoami-err: global rank {rank}")
    assert main(["verify", str(out)]) == 0


@pytest.mark.sixteen_ranks
def test_two_agents_of_eight_ranks_form_a_16_rank_job(tmp_path):
    out = tmp_path / "2x8"
    assert two_nodes(out, 8, "rank_pass.py") == (0, 0)
    assert receipt(out)["geometry"]["world_size"] == 16
    assert len(records(out)) == 16
    assert processes_of_run(out) == []
