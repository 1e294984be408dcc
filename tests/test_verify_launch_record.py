"""The launcher's record of the launch is kept in the bundle (launch.json and, with several nodes,
each node's marker under nodes/), and the receipt is held to it: a forger who drops the record,
edits it together with the exit code it implies, or leaves out a node whose marker says it
failed is caught, even with every hash resealed (`_support.forge`)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import passing_run
from _support.forge import forge
from _support.smoke import H200, passing_result

from harness.evidence import launch_record, rules, verify
from harness.evidence.collect import load_records
from harness.evidence.files import sha256_file
from harness.evidence.junit import merge_junit
from harness.evidence.launch_record import launch_record_problems
from harness.evidence.rederive import derive_stated
from harness.evidence.strays import set_aside
from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle
from harness.launch import nodes
from harness.schema.launch import Launch, NodeState
from harness.schema.rank_record import junit_path, rank_record_path
from harness.schema.receipt import Receipt, RunExtra
from harness.schema.smoke import Smoke
from harness.smoke.bundle import write_smoke_bundle

WORLD = 2
SMOKE = {"machine": H200.model_dump(mode="json"), "failures": []}
ABSENT = (
    "receipt.json: run.extra.launch is absent: a run's exit code and timeout follow from the "
    "launcher's record of its launch, and this receipt has none"
)


def failed_launch(tmp_path: Path) -> Path:
    """Passing rank records whose torchrun exited 1 (a rank crashed on its way out): a fail."""
    out = tmp_path / "bundle"
    ctx = passing_run(out, world=WORLD)
    extra = RunExtra(launch=Launch(exit_code=1, elapsed_s=3.5, leftovers=[4242]))
    finalize_bundle(out, dataclasses.replace(ctx, exit_code=1, extra=extra))
    assert verify_bundle(out).ok, verify_bundle(out).problems
    return out


def receipt_of(bundle: Path) -> Receipt:
    return Receipt.model_validate_json((bundle / "receipt.json").read_text())


def test_the_bundle_keeps_the_launch_record_its_receipt_states(tmp_path: Path) -> None:
    bundle = failed_launch(tmp_path)
    written = receipt_of(bundle)
    kept = Launch.model_validate_json((bundle / "launch.json").read_text())
    assert kept == written.run.extra.launch
    assert (kept.exit_code, kept.leftovers) == (1, [4242])
    assert written.files["launch.json"] == sha256_file(bundle / "launch.json")
    assert written.verdict == "fail"


def test_a_receipt_that_drops_its_launch_record_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = failed_launch(tmp_path)

    def drop(data: dict[str, Any]) -> None:
        data["run"]["extra"]["launch"] = None
        data["run"]["exit_code"] = 0

    assert forge(bundle, drop).verdict == "pass"  # the forger's prize
    with monkeypatch.context() as patch:
        patch.setattr(verify, "launch_record_problems", lambda *_: [])
        assert verify_bundle(bundle).ok  # without the record, nothing holds the exit code
    assert verify_bundle(bundle).problems == (ABSENT,)


def test_a_launch_record_edited_with_its_exit_code_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = failed_launch(tmp_path)

    def edit(data: dict[str, Any]) -> None:
        data["run"]["extra"]["launch"].update(exit_code=0, leftovers=[])
        data["run"]["exit_code"] = 0

    assert forge(bundle, edit).verdict == "pass"
    with monkeypatch.context() as patch:
        patch.setattr(verify, "launch_record_problems", lambda *_: [])
        assert verify_bundle(bundle).ok
    assert verify_bundle(bundle).problems == (
        "receipt.json: run.extra.launch is not what launch.json records (exit code 1, "
        "timed out False)",
    )


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "launch.json: missing: the receipt's run.extra.launch has no record to match"),
        (b"[1]", "launch.json: not a launch record: "),
        (b"{not json", "launch.json: not a launch record: "),
        (b"{}", "receipt.json: run.extra.launch is not what launch.json records (exit code 0, "),
    ],
    ids=["missing", "not-a-record", "not-json", "another-launch"],
)
def test_a_launch_json_replaced_or_removed_is_caught(
    tmp_path: Path, content: bytes | None, problem: str
) -> None:
    """Resealed with the receipt's files map following it, so only the record check can tell."""
    bundle = failed_launch(tmp_path)
    path = bundle / "launch.json"
    if content is None:
        path.unlink()
    else:
        path.write_bytes(content)

    def follow(data: dict[str, Any]) -> None:
        if content is None:
            del data["files"]["launch.json"]
        else:
            data["files"]["launch.json"] = sha256_file(path)

    forge(bundle, follow)
    problems = verify_bundle(bundle).problems
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_a_launch_json_written_by_the_run_is_set_aside_not_believed(tmp_path: Path) -> None:
    """A test that writes launch.json (exit code 0) into the out folder does not get to speak
    for torchrun: its file is a stray, and the writer's record says how torchrun ended."""
    out = tmp_path / "bundle"
    ctx = passing_run(out, world=WORLD)
    planted = json.dumps({"exit_code": 0}).encode()
    (out / "launch.json").write_bytes(planted)
    extra = RunExtra(launch=Launch(exit_code=1))
    ctx = dataclasses.replace(ctx, exit_code=1, extra=extra)
    strays = set_aside(out)
    ctx = dataclasses.replace(ctx, extra=ctx.extra.model_copy(update={"strays": strays}))
    written = finalize_bundle(out, ctx)
    assert [(s.path, s.action) for s in strays] == [("launch.json", "moved to strays/launch.json")]
    assert (out / "strays" / "launch.json").read_bytes() == planted
    assert Launch.model_validate_json((out / "launch.json").read_text()).exit_code == 1
    assert written.run.exit_code == 1 and written.verdict == "fail"
    assert verify_bundle(out).ok, verify_bundle(out).problems


# -- the smoke, the one receipt without a launch ------------------------------------------------


@pytest.fixture
def smoke_bundle(tmp_path: Path) -> Path:
    """The one-GPU smoke's bundle, as `dcpqual gpu-smoke` writes it: no torchrun, no launch."""
    out = tmp_path / "smoke"
    out.mkdir()
    written = write_smoke_bundle(out, passing_result(), command=["dcpqual", "gpu-smoke"])
    assert written.run.extra.launch is None and written.run.extra.smoke is not None
    assert verify_bundle(out).ok, verify_bundle(out).problems
    return out


def test_a_smoke_s_receipt_is_held_to_its_own_result(smoke_bundle: Path) -> None:
    receipt = receipt_of(smoke_bundle)
    assert launch_record_problems(smoke_bundle, receipt) == []
    (smoke_bundle / "launch.json").write_text("{}")
    assert launch_record_problems(smoke_bundle, receipt) == [
        "launch.json: a smoke's bundle has no launch"
    ]
    (smoke_bundle / "launch.json").unlink()
    failed = receipt.run.extra.model_copy(
        update={"smoke": Smoke(machine=H200, failures=["capture: lazy work"])}
    )
    edited = receipt.model_copy(update={"run": receipt.run.model_copy(update={"extra": failed})})
    assert launch_record_problems(smoke_bundle, edited) == [
        "receipt.json: run.extra.smoke is not what smoke/result.json records"
    ]
    (smoke_bundle / "smoke" / "result.json").unlink()
    assert launch_record_problems(smoke_bundle, receipt) == [
        "smoke/result.json: missing: the receipt's run.extra.smoke has no result"
    ]


def as_smoke(data: dict[str, Any]) -> None:
    """The forger's disguise: the torchrun run was the smoke, which records no launch."""
    data["run"]["extra"].update(launch=None, nodes=None, smoke=SMOKE)
    data["run"]["exit_code"] = 0
    data["files"].pop("launch.json", None)
    data["limitations"].append(f"smoke: {rules.SMOKE_LIMITATION}")  # as a smoke's must


def test_a_torchrun_run_cannot_call_itself_a_smoke_to_drop_its_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = failed_launch(tmp_path)
    (bundle / "launch.json").unlink()
    assert forge(bundle, as_smoke).verdict == "pass"
    with monkeypatch.context() as patch:
        patch.setattr(launch_record, "_smoke_problems", lambda *_: [])
        assert verify_bundle(bundle).ok  # a smoke's receipt is the one without a launch
    assert verify_bundle(bundle).problems == (
        "receipt.json: run.extra.smoke on a run of 2 rank(s) on 1 node(s): the smoke is one "
        "rank, and every other run records its launch",
    )


def test_a_one_rank_torchrun_run_cannot_call_itself_a_smoke_with_a_smoke_s_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rank on one node, as the smoke is, and a passing smoke result added beside its
    records: its torchrun's exit 1 (leftovers) would be gone with its launch. The smoke's record
    holds the smoke's checks; this one holds the run's own tests."""
    out = tmp_path / "bundle"
    ctx = passing_run(out, world=1)
    extra = RunExtra(launch=Launch(exit_code=1, elapsed_s=3.5, leftovers=[4242]))
    finalize_bundle(out, dataclasses.replace(ctx, nproc_per_node=1, exit_code=1, extra=extra))
    assert receipt_of(out).verdict == "fail"
    (out / "launch.json").unlink()
    result = out / "smoke" / "result.json"
    result.parent.mkdir()
    result.write_text(json.dumps(passing_result().to_json(), indent=2, sort_keys=True) + "\n")

    def disguise(data: dict[str, Any]) -> None:
        as_smoke(data)
        data["files"]["smoke/result.json"] = sha256_file(result)

    assert forge(out, disguise).verdict == "pass"
    with monkeypatch.context() as patch:
        patch.setattr(launch_record, "_smoke_record_problems", lambda *_: [])
        assert verify_bundle(out).ok  # every other layer is fooled
    assert verify_bundle(out).problems == (
        "records/rank-00.json: not the smoke's checks that smoke/result.json gives: test 0 is "
        "suites/warm/test_signatures.py::test_kimi_signatures passed where it gives "
        "smoke/gpu_smoke.py::test_capture[kimi-k3] passed",
    )


def test_a_smoke_s_record_cannot_pass_a_check_its_result_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The smoke's result is a witness of its own: a capture it failed (a replay missing)
    passed in the rank record and JUnit report, merged.xml merged again and the receipt forged
    to match, is caught, though the receipt's smoke failures still name it."""
    out = tmp_path / "smoke"
    out.mkdir()
    failing = dataclasses.replace(
        passing_result(), capture=dataclasses.replace(passing_result().capture, replays=1)
    )
    assert write_smoke_bundle(out, failing, command=["dcpqual", "gpu-smoke"]).verdict == "fail"
    record = rank_record_path(out / "records", 0)
    data = json.loads(record.read_text())
    data["tests"][0].update(outcome="passed", message=None)
    record.write_text(json.dumps(data))
    report = junit_path(out, 0)
    report.write_text(re.sub(r"<failure[^>]*?(/>|>.*?</failure>)", "", report.read_text(), count=1))
    merged = out / "junit" / "merged.xml"
    merged.write_bytes(merge_junit(out, load_records(out, 1)).xml)

    def rehash(data: dict[str, Any]) -> None:
        for path in (record, report, merged):
            data["files"][path.relative_to(out).as_posix()] = sha256_file(path)
        facts = derive_stated(out, Receipt.model_validate(data))
        data["suites"] = {k: v.model_dump() for k, v in facts.suites.items()}
        data["failed_tests"] = []

    forged = forge(out, rehash)
    assert forged.verdict == "pass" and forged.run.extra.smoke is not None, forged.failures
    assert forged.run.extra.smoke.failures  # the smoke's own verdict is still FAIL
    with monkeypatch.context() as patch:
        patch.setattr(launch_record, "_smoke_record_problems", lambda *_: [])
        assert verify_bundle(out).ok  # every other layer is fooled
    assert verify_bundle(out).problems == (
        "records/rank-00.json: not the smoke's checks that smoke/result.json gives: test 0 is "
        "smoke/gpu_smoke.py::test_capture[kimi-k3] passed where it gives "
        "smoke/gpu_smoke.py::test_capture[kimi-k3] failed",
    )


def test_a_torchrun_run_that_keeps_its_launch_cannot_call_itself_a_smoke(tmp_path: Path) -> None:
    """A smoke's receipt is excused the engine lane's limitations (the smoke runs no engine):
    a torchrun receipt that adds `smoke` beside its launch record, and drops its `engine`
    limitation, is held to the smoke's facts all the same (one rank, a smoke result)."""
    out = tmp_path / "bundle"
    finalize_bundle(out, passing_run(out, world=WORLD))
    assert "engine" in receipt_of(out).limitation_keys()

    def disguise(data: dict[str, Any]) -> None:
        data["run"]["extra"]["smoke"] = SMOKE
        data["limitations"] = [x for x in data["limitations"] if not x.startswith("engine: ")]
        data["limitations"].append(f"smoke: {rules.SMOKE_LIMITATION}")

    forged = forge(out, disguise)
    assert forged.run.extra.launch is not None and "engine" not in forged.limitation_keys()
    assert verify_bundle(out).problems == (
        "receipt.json: run.extra.smoke beside run.extra.launch: the smoke starts no torchrun, "
        "and a run that records its launch is not the smoke",
        "launch.json: a smoke's bundle has no launch",
        "receipt.json: run.extra.smoke on a run of 2 rank(s) on 1 node(s): the smoke is one "
        "rank, and every other run records its launch",
    )


def test_a_smoke_s_receipt_that_states_a_launch_is_refused(smoke_bundle: Path) -> None:
    """The one-rank smoke with its own result, given a launch record: still not a smoke."""
    receipt = receipt_of(smoke_bundle)
    launched = receipt.model_copy(
        update={"run": receipt.run.model_copy(update={"extra": receipt.run.extra.model_copy(
            update={"launch": Launch()})})}
    )  # fmt: skip
    assert launch_record_problems(smoke_bundle, launched) == [
        "receipt.json: run.extra.smoke beside run.extra.launch: the smoke starts no torchrun, "
        "and a run that records its launch is not the smoke"
    ]


def test_a_smoke_s_receipt_cannot_drop_its_smoke_limitation(smoke_bundle: Path) -> None:
    """`smoke` is required of every smoke's receipt and denies `qualified`: a one-GPU smoke
    shows that the GPU paths run; it qualifies nothing."""
    assert receipt_of(smoke_bundle).limitation_keys()[:1] == ["smoke"]

    def drop(data: dict[str, Any]) -> None:
        data["limitations"] = [x for x in data["limitations"] if not x.startswith("smoke: ")]

    assert "smoke" not in forge(smoke_bundle, drop).limitation_keys()
    assert verify_bundle(smoke_bundle).problems == (
        f"receipt.json: limitations do not name 'smoke': {rules.SMOKE_LIMITATION}",
    )
    assert "smoke" in rules.DENIES_QUALIFIED


# -- several nodes -----------------------------------------------------------------------------


def marker(node: int, exit_code: int = 0) -> NodeState:
    return NodeState(
        node_rank=node,
        nnodes=2,
        rdzv_endpoint="n0:29400",
        state="finished",
        exit_code=exit_code,
        hostname=f"node{node}",
    )


def two_nodes(bundle: Path, stated: dict[str, NodeState | None] | None) -> Receipt:
    """The bundle's receipt as a 2-node run's that states `stated`; both nodes wrote their
    markers into the bundle, node 1's saying its torchrun exited 3."""
    for written in (marker(0), marker(1, exit_code=3)):
        nodes.write_marker(bundle, written)
    receipt = receipt_of(bundle)
    geometry = receipt.geometry.model_copy(update={"nnodes": 2, "nproc_per_node": 1})
    extra = receipt.run.extra.model_copy(update={"nodes": stated})
    run = receipt.run.model_copy(update={"extra": extra})
    return receipt.model_copy(update={"geometry": geometry, "run": run})


def test_every_node_s_marker_is_the_one_it_wrote_into_the_bundle(tmp_path: Path) -> None:
    bundle = failed_launch(tmp_path)
    stated: dict[str, NodeState | None] = {"0": marker(0), "1": marker(1, exit_code=3)}
    assert launch_record_problems(bundle, two_nodes(bundle, stated)) == []


@pytest.mark.parametrize(
    ("stated", "problem"),
    [
        (
            {"0": marker(0)},
            "receipt.json: run.extra.nodes has no entry for node 1 (a node that left no marker "
            "is recorded as null)",
        ),
        (
            {"0": marker(0), "1": marker(1)},
            "receipt.json: run.extra.nodes['1'] is not the marker nodes/node-01.json holds "
            "(state finished, exit code 3)",
        ),
        (
            {"0": marker(0), "1": None},
            "receipt.json: run.extra.nodes['1'] is not the marker nodes/node-01.json holds "
            "(state finished, exit code 3)",
        ),
        (None, "receipt.json: run.extra.nodes is absent: a 2-node run records every node's marker"),
    ],
    ids=["node-dropped", "exit-code-edited", "marker-denied", "nodes-dropped"],
)
def test_a_node_s_failure_cannot_be_edited_out_of_the_receipt(
    tmp_path: Path, stated: dict[str, NodeState | None] | None, problem: str
) -> None:
    bundle = failed_launch(tmp_path)
    assert launch_record_problems(bundle, two_nodes(bundle, stated)) == [problem]


def test_a_failed_node_cannot_be_dropped_by_calling_the_run_a_smoke(tmp_path: Path) -> None:
    """Without a launch record the node markers are still read: a 2-node run is no smoke."""
    bundle = failed_launch(tmp_path)
    receipt = two_nodes(bundle, None)
    extra = receipt.run.extra.model_copy(update={"launch": None, "smoke": Smoke(machine=H200)})
    disguised = receipt.model_copy(update={"run": receipt.run.model_copy(update={"extra": extra})})
    assert launch_record_problems(bundle, disguised) == [
        "launch.json: a smoke's bundle has no launch",
        "receipt.json: run.extra.smoke on a run of 2 rank(s) on 2 node(s): the smoke is one "
        "rank, and every other run records its launch",
        "receipt.json: run.extra.nodes is absent: a 2-node run records every node's marker",
    ]


def test_a_node_s_marker_names_that_node(tmp_path: Path) -> None:
    """Node 1's marker (its leftovers, its zygote) cannot pass for node 0's, which the rules
    take from the launch instead and skip among the markers."""
    bundle = failed_launch(tmp_path)
    as_node_0 = marker(1, exit_code=3).model_copy(update={"node_rank": 0})
    receipt = two_nodes(bundle, {"0": marker(0), "1": as_node_0})
    nodes.marker_path(bundle, 1).write_text(as_node_0.model_dump_json())
    assert launch_record_problems(bundle, receipt) == [
        "receipt.json: run.extra.nodes['1'] is the marker of node 0 of 2, not of node 1 of 2"
    ]


def test_a_node_the_run_does_not_have_is_named(tmp_path: Path) -> None:
    bundle = failed_launch(tmp_path)
    stated = {"0": marker(0), "1": marker(1, exit_code=3), "2": marker(2)}
    assert launch_record_problems(bundle, two_nodes(bundle, stated)) == [
        "receipt.json: run.extra.nodes has '2', not a node of this 2-node run"
    ]


def test_a_node_that_left_no_marker_is_stated_as_null(tmp_path: Path) -> None:
    bundle = failed_launch(tmp_path)
    receipt = two_nodes(bundle, {"0": marker(0), "1": None})
    nodes.marker_path(bundle, 1).unlink()
    assert launch_record_problems(bundle, receipt) == []
