"""A receipt's models, hosts, launch outcome and the limitations they call for are held to what the
bundle records: a forger who edits them, makes the receipt agree with itself and reseals every
hash (`_support.forge`) is caught.

- `models` (vLLM's real trees built) and `environment.hosts` are re-derived from the rank
  records, which are covered by the bundle's hashes.
- `run.exit_code` and `run.timed_out` follow from the launcher's record of its torchrun
  (`run.extra.launch`, and every node's marker in a multi-node run), by the one rule the writer
  uses too.
- What the run did not build of vLLM's real trees, what the trees it built say of themselves,
  and warm code other than vLLM's own are required limitations: a receipt cannot drop them.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import context, passing_run, real_tree, torchrun_logs, write_rank
from _support.forge import forge

from harness.evidence import rules, verify
from harness.evidence.schema import Models, Source
from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle
from harness.schema.base import Limitation
from harness.schema.launch import NodeState
from harness.schema.rank_record import RealTree
from harness.schema.receipt import Launch, RunExtra

WORLD = 2


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A passing bundle whose ranks built no real tree (stand-ins only), on host node0."""
    out = tmp_path_factory.mktemp("stand-ins") / "bundle"
    finalize_bundle(out, passing_run(out, world=WORLD))
    return out


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A passing bundle whose ranks each built vLLM's own Kimi-K3 tree."""
    out = tmp_path_factory.mktemp("real") / "bundle"
    out.mkdir()
    for rank in range(WORLD):
        write_rank(out, rank, WORLD, real_trees=[real_tree(rank)])
    torchrun_logs(out, WORLD)
    finalize_bundle(out, context(WORLD))
    return out


def copy(bundle: Path, tmp_path: Path) -> Path:
    target = tmp_path / "bundle"
    shutil.copytree(bundle, target)
    assert verify_bundle(target).ok, verify_bundle(target).problems
    return target


def receipt(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "receipt.json").read_text())


def key(line: str) -> str:
    return line.partition(": ")[0]


def without(*keys: str) -> Any:
    def edit(data: dict[str, Any]) -> None:
        data["limitations"] = [x for x in data["limitations"] if key(x) not in keys]

    return edit


def is_real_tree_key(name: str) -> bool:
    return name.startswith("real") or name == "vllm"


# -- re-derived from the rank records ----------------------------------------------------------


def test_claiming_the_real_trees_of_another_bundle_is_caught(
    stand_ins: Path, real: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forger copies an honest real-tree receipt's `models` and the limitations that go
    with them into a stand-in receipt: only the records can tell."""
    honest = receipt(real)
    assert honest["models"]["real"] == ["kimi-k3"]

    def claim(data: dict[str, Any]) -> None:
        data["models"] = honest["models"]
        kept = [x for x in data["limitations"] if not is_real_tree_key(key(x))]
        data["limitations"] = kept + [x for x in honest["limitations"] if is_real_tree_key(key(x))]

    bundle = copy(stand_ins, tmp_path)
    forge(bundle, claim)
    with monkeypatch.context() as patch:
        patch.setattr(verify, "rederive_problems", lambda *_: [])
        assert verify_bundle(bundle).ok  # every other layer is fooled
    problems = verify_bundle(bundle).problems
    assert problems[0] == (
        "receipt.json: models.build_s_max is 12.0 but the rank records and JUnit reports say 0.0"
    )
    assert len(problems) == 1, problems


def test_other_hosts_than_the_records_name_are_caught(
    stand_ins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = copy(stand_ins, tmp_path)
    forge(bundle, lambda d: d["environment"].update(hosts=["gpu-a", "gpu-b"]))
    with monkeypatch.context() as patch:
        patch.setattr(verify, "rederive_problems", lambda *_: [])
        assert verify_bundle(bundle).ok
    assert verify_bundle(bundle).problems == (
        "receipt.json: environment.hosts[0] is 'gpu-a' but the rank records and JUnit reports "
        "say 'node0'",
    )


def test_the_hosts_are_every_record_s_hostname_once(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    for rank, host in enumerate(["node1", "node0", "node1"]):
        write_rank(out, rank, 3, hostname=host)
    torchrun_logs(out, 3)
    written = finalize_bundle(out, context(3))
    assert written.environment.hosts == ["node0", "node1"]
    assert verify_bundle(out).ok


# -- the launcher's record of the launch -------------------------------------------------------


def launched(
    tmp_path: Path, *, exit_code: int, timed_out: bool = False, nodes: dict | None = None
) -> Path:
    """Passing rank records; torchrun ended as `exit_code` and `timed_out` say."""
    out = tmp_path / "launched"
    ctx = passing_run(out, world=WORLD)
    launch = Launch(exit_code=exit_code, timed_out=timed_out)
    extra = RunExtra(launch=launch, nodes=nodes)
    finalize_bundle(
        out, dataclasses.replace(ctx, exit_code=exit_code, timed_out=timed_out, extra=extra)
    )
    assert verify_bundle(out).ok, verify_bundle(out).problems
    assert receipt(out)["verdict"] == "fail"
    return out


def test_a_zero_exit_code_the_launch_does_not_say_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = launched(tmp_path, exit_code=1)
    forged = forge(bundle, lambda d: d["run"].update(exit_code=0))
    assert forged.verdict == "pass"  # the forger's prize
    with monkeypatch.context() as patch:
        patch.setattr(verify, "_check_launched", lambda _: [], raising=False)
        assert verify_bundle(bundle).ok
    assert verify_bundle(bundle).problems == (
        "receipt.json: run.exit_code is 0 but the launcher's record of the launch "
        "(run.extra.launch) says 1",
    )


def test_a_timeout_the_receipt_drops_is_caught(tmp_path: Path) -> None:
    bundle = launched(tmp_path, exit_code=-9, timed_out=True)
    forged = forge(bundle, lambda d: d["run"].update(exit_code=0, timed_out=False))
    assert forged.verdict == "pass"
    assert verify_bundle(bundle).problems == (
        "receipt.json: run.exit_code is 0 but the launcher's record of the launch "
        "(run.extra.launch) says -9",
        "receipt.json: run.timed_out is False but the launcher's record of the launch "
        "(run.extra.launch) says True",
    )


def marker(node: int, *, exit_code: int | None = 0, state: str = "finished") -> NodeState:
    return NodeState(
        node_rank=node, nnodes=2, rdzv_endpoint="n0:29400", state=state, exit_code=exit_code
    )  # type: ignore[arg-type]


def test_the_launched_outcome_is_the_worst_of_every_node() -> None:
    ok = Launch(exit_code=0)
    assert rules.launched_outcome(ok, None) == (0, False)
    assert rules.launched_outcome(Launch(exit_code=2, timed_out=True), None) == (2, True)
    both = {"0": marker(0), "1": marker(1, exit_code=3)}
    assert rules.launched_outcome(ok, both) == (3, False)
    assert rules.launched_outcome(Launch(exit_code=2), both) == (2, False)  # node 0's first
    assert rules.launched_outcome(ok, {"0": marker(0), "1": None}) == (1, False)
    started = {"0": marker(0), "1": marker(1, exit_code=None, state="started")}
    assert rules.launched_outcome(ok, started) == (1, False)
    untold = {"0": marker(0), "1": marker(1, exit_code=None)}  # finished, not saying how
    assert rules.launched_outcome(ok, untold) == (1, False)
    late = marker(1).model_copy(update={"timed_out": True})
    assert rules.launched_outcome(ok, {"0": marker(0), "1": late}) == (0, True)
    many = {str(n): marker(n, exit_code=n) for n in (10, 2)}
    assert rules.launched_outcome(ok, many) == (2, False)  # in node order, not key order


def test_another_node_s_failure_cannot_be_dropped_from_the_exit_code(tmp_path: Path) -> None:
    nodes = {"0": marker(0), "1": marker(1, exit_code=3)}
    bundle = launched(tmp_path, exit_code=0, nodes=nodes)
    assert receipt(bundle)["run"]["exit_code"] == 3
    forge(bundle, lambda d: d["run"].update(exit_code=0))
    assert verify_bundle(bundle).problems == (
        "receipt.json: run.exit_code is 0 but the launcher's record of the launch "
        "(run.extra.launch, run.extra.nodes) says 3",
    )


def test_the_writer_takes_the_run_s_outcome_from_the_launch(tmp_path: Path) -> None:
    """A context whose summary disagrees with its own launch record: the record wins."""
    out = tmp_path / "bundle"
    ctx = passing_run(out, world=WORLD)
    extra = RunExtra(launch=Launch(exit_code=1, timed_out=True))
    written = finalize_bundle(out, dataclasses.replace(ctx, exit_code=0, extra=extra))
    assert (written.run.exit_code, written.run.timed_out) == (1, True)
    assert written.verdict == "fail"
    assert verify_bundle(out).ok


# -- required limitations ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bundle_name", "dropped", "named"),
    [
        ("stand_ins", ("real-trees", "vllm"), "real-trees"),
        ("real", ("real-tree shim cuda-stream-objects",), "real-tree shim cuda-stream-objects"),
        ("real", ("real-decode",), "real-decode"),
        ("stand_ins", ("warm-impl",), "warm-impl"),
    ],
    ids=["no-real-tree", "real-tree-shim", "real-decode", "warm-impl"],
)
def test_a_dropped_limitation_is_caught(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    bundle_name: str,
    dropped: tuple[str, ...],
    named: str,
) -> None:
    bundle = copy(request.getfixturevalue(bundle_name), tmp_path)
    assert named in {key(x) for x in receipt(bundle)["limitations"]}
    forge(bundle, without(*dropped))
    problems = verify_bundle(bundle).problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"receipt.json: limitations do not name '{named}': ")


def test_the_real_tree_limitation_says_why_no_real_tree_ran() -> None:
    none = Models()
    absent = rules.real_tree_limitations(models=none, sources={})
    assert absent == {
        "real-trees": "vLLM is not installed, so no real vLLM tree was built: only stand-in "
        "model classes ran, not vLLM's own"
    }
    installed = rules.real_tree_limitations(models=none, sources={"vllm": Source(version="0.32.0")})
    assert installed == {
        "real-trees": "vLLM 0.32.0 is installed but the run built none of its trees (--models "
        "stand-in, or no selected test built one): only stand-in model classes ran, not "
        "vLLM's own"
    }


def test_trees_that_say_the_same_thing_say_it_once() -> None:
    def tree(model: str, kv: str, text: str) -> RealTree:
        said = (Limitation(key="real-trees", text=text),)
        return RealTree(model, 2, 2, kv, "ag_rs", limitations=said)

    trees = [
        tree("kimi-k3", "auto", "A (x; y)"),
        tree("deepseek-v3", "auto", "B"),
        tree("kimi-k3", "fp8", "A (x; y)"),
    ]
    models = Models(real=["deepseek-v3", "kimi-k3"], trees=trees)
    found = rules.real_tree_limitations(models=models, sources={})
    assert found["real-trees"] == "A (x; y); B"
