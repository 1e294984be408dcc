"""A bundle node 1 wrote because node 0 of a two-node run died without writing one: it fails,
says so (`run.extra.node_zero_gone`, the `node-0` limitation, a `node-gone` root cause) and
verifies; a receipt that claims the limitation without the fact, keeps the fact without the
limitation, or passes with the fact does not, even resealed (`_support.forge`). The real run:
tests/test_reliability_node_gone.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import (
    NODES,
    context,
    passed,
    passing_run,
    torchrun_logs,
    write_rank,
)
from _support.forge import forge, reseal

from harness.evidence import rules
from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle
from harness.launch import nodes
from harness.schema.launch import Launch, NodeState
from harness.schema.rank_record import RankRecord
from harness.schema.receipt import NodeZeroGone, Receipt, RunExtra

GONE = NodeZeroGone(waited_s=3.0, by_node=1)


def _marker(node: int, **changes: Any) -> NodeState:
    state = NodeState(node_rank=node, nnodes=2, rdzv_endpoint="n0:29400", state="started")
    return state.model_copy(update=changes)


def _node_1_wrote_it(out: Path, gone: NodeZeroGone | None = GONE) -> Path:
    """Rank 0 (node 0) cut short in the second test, rank 1 (node 1) complete; node 0's
    marker still "started", node 1's "finished" with exit 1; node 1 writes the bundle."""
    write_rank(out, 0, 2, tests=[passed(NODES[0])], captures=[], complete=False, junit=False)
    write_rank(out, 1, 2, hostname="node1")
    path = out / "records" / "rank-01.json"
    replace(RankRecord.read(path), node_rank=1, local_rank=0).write(path)
    torchrun_logs(out, 2)
    launch = Launch(exit_code=1, elapsed_s=9.5)
    markers: dict[str, NodeState | None] = {
        "0": _marker(0),
        "1": _marker(1, state="finished", exit_code=1),
    }
    for marker in markers.values():
        assert marker is not None
        nodes.write_marker(out, marker)
    extra = RunExtra(launch=launch, nodes=markers, node_zero_gone=gone)
    ctx = context(2, nnodes=2, nproc_per_node=1, tp=2, dcp=2, exit_code=1, extra=extra)
    finalize_bundle(out, ctx)
    return out


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return _node_1_wrote_it(tmp_path / "bundle")


def _receipt(bundle: Path) -> Receipt:
    return Receipt.model_validate_json((bundle / "receipt.json").read_text())


def test_node_1_s_bundle_fails_says_why_and_verifies(bundle: Path) -> None:
    assert verify_bundle(bundle).problems == ()
    receipt = _receipt(bundle)
    assert (receipt.verdict, receipt.status) == ("fail", "not-qualified")
    assert receipt.run.extra.node_zero_gone == GONE
    assert receipt.failures[0] == rules.node_zero_gone_reason(GONE)
    cause = receipt.root_cause
    assert cause is not None and (cause.kind, cause.rank, cause.test) == ("node-gone", None, None)
    assert cause.message == (
        "node 0 is gone: it wrote no receipt within 3s of node 1's torchrun exiting and never "
        "said its own torchrun finished"
    )
    assert f"node-0: {rules.node_zero_limitation(GONE)}" in receipt.limitations
    assert rules.node_zero_limitation(GONE).startswith(
        "node 0 ended without writing the bundle; node 1 wrote it from what the shared folder held"
    )
    assert receipt.ranks.killed == [0]  # node 0's rank is a missing rank, failed by the rules


def _claims_the_limitation(data: dict[str, Any]) -> None:
    text = rules.node_zero_limitation(GONE)
    data["limitations"].append(f"node-0: {text}")


def test_the_limitation_without_the_fact_is_refused(tmp_path: Path) -> None:
    bundle = _node_1_wrote_it(tmp_path / "bundle", gone=None)  # node 0 said nothing: a fail
    assert verify_bundle(bundle).ok
    forge(bundle, _claims_the_limitation)
    assert verify_bundle(bundle).problems == (
        "receipt.json: limitation 'node-0' is named, but run.extra.node_zero_gone that alone "
        "gives it is absent",
    )


def _drops_the_limitation(data: dict[str, Any]) -> None:
    data["limitations"] = [x for x in data["limitations"] if not x.startswith("node-0: ")]


def test_the_fact_without_the_limitation_is_refused(bundle: Path) -> None:
    forge(bundle, _drops_the_limitation)
    assert verify_bundle(bundle).problems == (
        f"receipt.json: limitations do not name 'node-0': {rules.node_zero_limitation(GONE)}",
    )


def _reworded(data: dict[str, Any]) -> None:
    data["limitations"] = [
        "node-0: node 0 handed over cleanly" if x.startswith("node-0: ") else x
        for x in data["limitations"]
    ]


def test_the_limitation_reworded_is_refused(bundle: Path) -> None:
    forge(bundle, _reworded)
    assert verify_bundle(bundle).problems == (
        f"receipt.json: limitation 'node-0' does not say what the receipt's facts give: "
        f"{rules.node_zero_limitation(GONE)}",
    )


def _a_pass(data: dict[str, Any]) -> None:
    data["verdict"], data["status"], data["root_cause"], data["failures"] = (
        "pass",
        "source-qualified",
        None,
        [],
    )


def test_a_pass_with_the_fact_is_refused(bundle: Path) -> None:
    """Written straight (no forger's tool would make it agree with itself): the fact alone
    fails the run, whatever else the receipt says."""
    data = json.loads((bundle / "receipt.json").read_text())
    _a_pass(data)
    (bundle / "receipt.json").write_text(Receipt.model_validate(data).dumps())
    reseal(bundle)
    problems = verify_bundle(bundle).problems
    assert any(
        p.startswith("receipt.json: verdict is pass but its facts say fail (node 0 is gone: ")
        for p in problems
    ), problems


def test_the_fact_alone_fails_even_what_else_would_pass(tmp_path: Path) -> None:
    """The rule itself: with every other fact a pass, node 0 being gone fails the run."""
    out = tmp_path / "pass"
    finalize_bundle(out, passing_run(out, world=2))
    receipt = _receipt(out)
    assert rules.failure_reasons_of(receipt) == []
    run = receipt.run.model_copy(
        update={"extra": receipt.run.extra.model_copy(update={"node_zero_gone": GONE})}
    )
    gone = receipt.model_copy(update={"run": run})
    assert rules.failure_reasons_of(gone) == [rules.node_zero_gone_reason(GONE)]
    assert rules.verdict_of(rules.failure_reasons_of(gone)) == "fail"


def _blames_a_rank(data: dict[str, Any]) -> None:
    data["root_cause"] = {"rank": 1, "test": None, "message": "rank 1 did it", "kind": "run"}


def _node_gone_without_the_fact(data: dict[str, Any]) -> None:
    data["root_cause"] = {
        "rank": None,
        "test": None,
        "message": rules.node_zero_gone_reason(GONE),
        "kind": "node-gone",
    }


def _writer_not_a_node(data: dict[str, Any]) -> None:
    data["run"]["extra"]["node_zero_gone"]["by_node"] = 2


def _node_0_said_finished(data: dict[str, Any]) -> None:
    data["run"]["extra"]["nodes"]["0"].update(state="finished", exit_code=1)


@pytest.mark.parametrize(
    "edit, problem",
    [
        (
            _blames_a_rank,
            "receipt.json: root_cause.kind is 'run' but run.extra.node_zero_gone says 'node-gone'",
        ),
        (
            _writer_not_a_node,
            "receipt.json: run.extra.node_zero_gone.by_node is 2, not a node of this 2-node run",
        ),
        (
            _node_0_said_finished,
            "receipt.json: run.extra.node_zero_gone, but node 0's marker says its torchrun "
            "finished (such a node 0 writes the bundle itself)",
        ),
    ],
)
def test_the_fact_is_held_to_the_rest_of_the_receipt(bundle: Path, edit: Any, problem: str) -> None:
    forge(bundle, edit, launch_record=True)
    assert problem in verify_bundle(bundle).problems


def test_a_node_gone_cause_without_the_fact_is_refused(tmp_path: Path) -> None:
    bundle = _node_1_wrote_it(tmp_path / "bundle", gone=None)
    forge(bundle, _node_gone_without_the_fact)
    assert (
        "receipt.json: root_cause.kind is 'node-gone' but run.extra.node_zero_gone names no "
        "node 0 that was gone"
    ) in verify_bundle(bundle).problems
