"""Node 0 of a multi-node run dies (its agent SIGKILLed, as when its host is lost) while the
ranks run: node 1 writes the bundle in its place, a failing one that says node 0 is gone and
that `dcpqual verify` accepts; a node after node 1 follows node 1's bundle. Three real
`dcpqual run` agents of one rank each, sharing one rendezvous and one `--out`: node 1's part is
the same as in a two-node job (the later node only adds to what is checked), so one launch
shows both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _support.runs import (
    SUITES,
    free_port,
    processes_of_run,
    ranks_inside,
    receipt,
    wait_until,
)

from harness.cli import main
from harness.launch.launcher import NODE_WAIT_ENV

pytestmark = [pytest.mark.torchrun]
REPO = Path(__file__).resolve().parents[1]
TEST = "test_meets_its_peers_until_node_0_is_gone"
NNODES = 3  # node 0 is killed, node 1 writes the bundle, node 2 follows it


def _agent(out: Path, k: int, nnodes: int, endpoint: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "harness", "run", "--nproc-per-node", "1"]
    argv += ["--nnodes", str(nnodes), "--node-rank", str(k), "--rdzv-endpoint", endpoint]
    argv += ["--tp", str(nnodes), "--out", str(out)]
    argv += ["--timeout", "240", "--", str(SUITES / "rank_node_gone.py")]
    env = {**os.environ, NODE_WAIT_ENV: "3", "PYTHONPATH": str(REPO)}
    with (out.parent / f"{out.name}-node-{k}.console").open("wb") as console:
        return subprocess.Popen(argv, env=env, stdout=console, stderr=subprocess.STDOUT, cwd=REPO)


def test_node_1_writes_a_failing_bundle_that_verifies_when_node_0_is_killed(tmp_path):
    out = tmp_path / "shared"
    endpoint = f"127.0.0.1:{free_port()}"
    agents = {k: _agent(out, k, NNODES, endpoint) for k in range(NNODES)}
    try:
        assert wait_until(lambda: ranks_inside(out, NNODES, TEST), 240), "the ranks never met"
        agents[0].send_signal(signal.SIGKILL)
        assert agents[0].wait() == -signal.SIGKILL
        code = agents[1].wait(timeout=300)
        later = [agents[k].wait(timeout=300) for k in range(2, NNODES)]
    finally:
        for agent in agents.values():
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    console = (tmp_path / "shared-node-1.console").read_text(errors="replace")
    assert code == 1, console
    assert "node 1 writes the bundle" in console, console
    assert (out / "receipt.json").is_file() and (out / "SHA256SUMS").is_file()
    assert main(["verify", str(out)]) == 0  # an honest bundle: valid, and failing
    data = receipt(out)
    assert (data["verdict"], data["status"]) == ("fail", "not-qualified")
    assert data["run"]["extra"]["node_zero_gone"] == {"waited_s": 3.0, "by_node": 1}
    cause = data["root_cause"]
    assert (cause["kind"], cause["rank"]) == ("node-gone", None), cause
    assert cause["message"].startswith("node 0 is gone: it wrote no receipt within 3s")
    assert any(line.startswith("node-0: node 0 ended without") for line in data["limitations"])
    assert data["run"]["exit_code"] != 0
    zero = json.loads((out / "nodes" / "node-00.json").read_text())
    assert zero["state"] == "started"  # node 0 never said it finished
    assert 0 in data["ranks"]["killed"]  # node 0's rank left no complete record
    for k, later_code in enumerate(later, start=2):  # it follows node 1's bundle: failed
        later_console = (tmp_path / f"shared-node-{k}.console").read_text(errors="replace")
        assert later_code == 1 and "node 1's bundle says FAIL" in later_console, later_console
        assert json.loads((out / "nodes" / f"node-{k:02d}.json").read_text())["state"] != "started"
    assert wait_until(lambda: not processes_of_run(out), 90), processes_of_run(out)
