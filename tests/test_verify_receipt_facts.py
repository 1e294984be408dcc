"""A receipt's models, hosts, launch outcome and the limitations they call for are held to what the
bundle records: a forger who edits them, makes the receipt agree with itself and reseals every
hash (`_support.forge`) is caught.

- `models` (vLLM's real trees built) and `environment.hosts` are re-derived from the rank
  records, which are covered by the bundle's hashes.
- `run.exit_code` and `run.timed_out` follow from the launcher's record of its torchrun
  (`run.extra.launch`, and every node's marker in a multi-node run), by the one rule the writer
  uses too; an exit code of 0 is refused while a rank's torchrun error file is in the bundle.
- The failed-test list and its rootdir are held to the records whatever the receipt states, and
  the root cause is an interruption exactly when the launcher's record names one.
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
from _support.evidence_factory import (
    COMBINE_TEST,
    NODES,
    SIGNATURE_TEST,
    context,
    drawn_seed_start,
    failing_run,
    passed,
    passing_run,
    real_tree,
    torchrun_logs,
    write_rank,
)
from _support.forge import forge

from harness.evidence import rules, verify
from harness.evidence.environment import host_digest
from harness.evidence.files import sha256_file
from harness.evidence.launch_record import launch_record_bytes
from harness.evidence.run_context import TorchrunFailure
from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle
from harness.schema.base import Limitation
from harness.schema.launch import Interruption, NodeState
from harness.schema.rank_record import ErrorNote, RealTree, TestOutcome, rank_record_path
from harness.schema.receipt import Launch, Models, RunExtra, Source

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
        f"say {host_digest('node0')!r}",
    )


def test_the_hosts_are_every_record_s_hostname_once(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    for rank, host in enumerate(["node1", "node0", "node1"]):
        write_rank(out, rank, 3, hostname=host)
    torchrun_logs(out, 3)
    written = finalize_bundle(out, context(3))
    # as digests: the receipt names no machine (tests/test_no_host_names.py)
    assert written.environment.hosts == sorted([host_digest("node0"), host_digest("node1")])
    assert verify_bundle(out).ok


def test_skip_reasons_rewritten_with_merged_xml_are_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forger rewrites the skip reason in junit/merged.xml and in the receipt alike, and
    its hash in the receipt's `files`: the ranks' own JUnit reports still give the real one."""
    out = tmp_path / "bundle"
    out.mkdir()
    tests = [passed(n) for n in NODES]
    tests[0] = TestOutcome(nodeid=NODES[0], outcome="skipped", message="needs 16 ranks")
    for rank in range(WORLD):
        write_rank(out, rank, WORLD, tests=tests)
    assert finalize_bundle(out, context(WORLD)).skip_reasons == {"needs 16 ranks": 1}
    merged = out / "junit" / "merged.xml"
    merged.write_text(merged.read_text().replace("needs 16 ranks", "needs a CUDA GPU"))

    def rewrite(data: dict[str, Any]) -> None:
        data["skip_reasons"] = {"needs a CUDA GPU": 1}
        data["files"]["junit/merged.xml"] = sha256_file(merged)

    forge(out, rewrite)
    with monkeypatch.context() as patch:
        patch.setattr(verify, "rederive_problems", lambda *_: [])
        assert verify_bundle(out).ok  # every other layer is fooled
    assert verify_bundle(out).problems == (
        "receipt.json: skip_reasons.needs 16 ranks is absent but the rank records and JUnit "
        "reports say 1",
        "junit/merged.xml: cases.rank 00 warm: suites.warm.test_signatures::test_kimi_signatures"
        ".message is 'needs a CUDA GPU' but the rank records and JUnit reports say "
        "'needs 16 ranks'",
    )


def test_a_receipt_cannot_claim_the_layout_of_before_skip_reasons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receipt without `skip_reasons` is read in the layout of then: it owes no `engine`
    limitation, and its summary is the one of then. The forger drops both from a new bundle;
    its records state the launcher's string-hash seed, which that layout's writers never gave."""
    out = tmp_path / "bundle"
    for rank in range(WORLD):
        write_rank(out, rank, WORLD, start=drawn_seed_start())
    torchrun_logs(out, WORLD)
    written = finalize_bundle(out, context(WORLD))
    assert written.skip_reasons == {} and "engine" in written.limitation_keys()

    def legacy(data: dict[str, Any]) -> None:
        del data["skip_reasons"]
        without("engine")(data)

    assert forge(out, legacy).status == "source-qualified"
    with monkeypatch.context() as patch:
        patch.setattr(verify, "rederive_problems", lambda *_: [])
        assert verify_bundle(out).ok  # every other layer is fooled
    assert verify_bundle(out).problems == (
        "receipt.json: skip_reasons is None but the rank records and JUnit reports say {}",
    )


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


RANK_ERROR = "torchrun/run-1/attempt_0/1/error.json"


def crashed_on_the_way_out(tmp_path: Path, *, note: bool = False) -> Path:
    """Passing rank records, but rank 1 left torchrun's error file and torchrun exited 1: an
    honest `fail` whose root cause is that file (`note`: with the rank's own note in it, as
    the harness's rank writes it)."""
    out = tmp_path / "crashed"
    ctx = passing_run(out, world=WORLD)
    message = "Signal 11 (SIGSEGV) received by PID 1001"
    (out / RANK_ERROR).write_text(json.dumps({"message": message}))
    if note:
        ours = ErrorNote(rank=1, test=None, message=message, time=1764439200.0).to_json()
        kept = {"message": message, "extraInfo": {"dcpqual": ours}}
        (out / RANK_ERROR).write_text(json.dumps({"message": kept}))
    failure = TorchrunFailure(rank=1, message=message, time=1764439200.0, file=RANK_ERROR)
    launch = Launch(exit_code=1, elapsed_s=3.5)
    finalize_bundle(
        out,
        dataclasses.replace(
            ctx, exit_code=1, extra=RunExtra(launch=launch), torchrun_error=failure
        ),
    )
    assert verify_bundle(out).ok, verify_bundle(out).problems
    assert receipt(out)["root_cause"]["kind"] == "torchrun"
    return out


def test_a_zero_exit_code_is_refused_while_a_rank_s_error_file_says_it_failed(
    tmp_path: Path,
) -> None:
    """The forger rewrites launch.json with the receipt, so the launcher's record says 0 too;
    the error file the rank wrote itself still says a rank failed. (A forger who also deletes
    that file and its hashes is caught by nothing but a signature.)"""
    bundle = crashed_on_the_way_out(tmp_path, note=True)
    clean = Launch(exit_code=0, elapsed_s=3.5)
    (bundle / "launch.json").write_bytes(launch_record_bytes(clean))

    def follow(data: dict[str, Any]) -> None:
        data["run"]["extra"]["launch"] = clean.model_dump(mode="json")
        data["run"]["exit_code"] = 0
        data["files"]["launch.json"] = sha256_file(bundle / "launch.json")

    assert forge(bundle, follow).verdict == "pass"
    assert (bundle / RANK_ERROR).is_file()
    assert verify_bundle(bundle).problems == (
        "receipt.json: run.exit_code is 0 but the bundle holds 1 rank error file(s) of "
        f"torchrun, the first {RANK_ERROR} (a rank writes one only when it fails, and then "
        "torchrun exits non-zero)",
    )


def test_an_error_file_a_rank_s_child_left_does_not_count_against_a_zero_exit_code(
    tmp_path: Path,
) -> None:
    """A test that checks a failing launcher started as a child of the rank leaves torch's own
    error file where the rank's would go (the child inherits TORCHELASTIC_ERROR_FILE); the rank
    passed and torchrun exited 0, and the honest bundle verifies."""
    out = tmp_path / "child"
    ctx = passing_run(out, world=WORLD)
    child = {"message": {"message": "ValueError: bad", "extraInfo": {"timestamp": "1"}}}
    (out / RANK_ERROR).write_text(json.dumps(child))
    written = finalize_bundle(out, ctx)
    assert written.verdict == "pass"
    assert verify_bundle(out).ok, verify_bundle(out).problems


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


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_limitation_named_twice_is_caught(stand_ins: Path, tmp_path: Path, where: str) -> None:
    """The rules' text kept, and a second under the same key beside it: a reader that maps
    keys to texts (`{i["key"]: i["text"] for i in limitation_items}`) keeps the last."""
    bundle = copy(stand_ins, tmp_path)
    forged = "nccl: not applicable: the NCCL lane runs nightly"

    def twice(data: dict[str, Any]) -> None:
        lines = data["limitations"]
        at = next(i for i, line in enumerate(lines) if key(line) == "nccl")
        lines.insert(at + (where == "after"), forged)

    forge(bundle, twice)
    assert forged in receipt(bundle)["limitations"]
    assert verify_bundle(bundle).problems == (
        "receipt.json: limitations name 'nccl' more than once",
    )


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


# -- the failure's story -----------------------------------------------------------------------


def failed_combine(tmp_path: Path, rootdir: str | None = None) -> Path:
    """Rank 1 fails the combine test, rank 0 as its follow-on; the ranks name `rootdir`."""
    out = tmp_path / "failed"
    ctx = failing_run(out, world=WORLD, bad_rank=1)
    if rootdir is not None:
        for rank in range(WORLD):
            path = rank_record_path(out / "records", rank)
            data = json.loads(path.read_text())
            data["extra"]["rootdir"] = rootdir
            path.write_text(json.dumps(data))
    written = finalize_bundle(out, ctx)
    assert [t.nodeid for t in written.failed_tests] == [COMBINE_TEST]
    assert written.run.rootdir == rootdir
    assert verify_bundle(out).ok, verify_bundle(out).problems
    return out


@pytest.mark.parametrize("rootdir", [None, "/work/dcpqual"], ids=["no-rootdir", "rootdir"])
def test_an_emptied_failed_test_list_is_caught_with_its_rootdir_dropped(
    tmp_path: Path, rootdir: str | None
) -> None:
    """Dropping the rootdir (written with the list) switches neither check off."""
    bundle = failed_combine(tmp_path, rootdir)
    forged = forge(bundle, lambda d: d.update(failed_tests=[]) or d["run"].update(rootdir=None))
    assert forged.verdict == "fail" and forged.failed_tests == []
    expected = [
        "receipt.json: failed_tests length is 0 but the rank records and JUnit reports say 1"
    ]
    if rootdir is not None:
        expected.append(
            "receipt.json: run.rootdir is None but the rank records and JUnit reports say "
            f"{rootdir!r}"
        )
    assert verify_bundle(bundle).problems == tuple(expected)


def test_a_root_cause_called_an_interruption_without_one_is_caught(tmp_path: Path) -> None:
    """Calling the cause an interruption neither moves the blame off rank 1's test nor passes
    without the launcher's record of an interruption."""
    bundle = failed_combine(tmp_path)

    def blame_rank_0(data: dict[str, Any]) -> None:
        data["root_cause"] = {
            "rank": 0,
            "test": SIGNATURE_TEST,
            "kind": "interrupted",
            "message": "rank 0 was interrupted by the operator",
        }
        data["failed_tests"] = []
        data["run"]["rootdir"] = None

    forge(bundle, blame_rank_0)
    assert verify_bundle(bundle).problems == (
        "receipt.json: root_cause.kind is 'interrupted' but the launcher's record of the launch "
        "(run.extra.launch.interrupted) names no interruption",
        "receipt.json: root_cause.kind is 'interrupted' but the rank records and JUnit reports "
        "say 'test'",
        "receipt.json: failed_tests length is 0 but the rank records and JUnit reports say 2",
    )


@pytest.mark.parametrize("kind", ["killed", "test", "broke-world"])
def test_a_root_cause_the_records_do_not_name_cannot_blame_a_rank_s_test(
    tmp_path: Path, kind: str
) -> None:
    """Every rank finished and passed, torchrun exited 1: the records name no cause, so the
    receipt's cannot be a rank's test (a kind only the records give), even with the failed-test
    list written to match it."""
    out = tmp_path / "exit-1"
    passing_run(out, world=WORLD)
    finalize_bundle(out, context(WORLD, exit_code=1))
    assert verify_bundle(out).ok, verify_bundle(out).problems
    planted = "rank 1 died in the capture test"

    def blame_rank_1(data: dict[str, Any]) -> None:
        data["root_cause"] = {"rank": 1, "test": SIGNATURE_TEST, "kind": kind, "message": planted}
        failed = {"nodeid": SIGNATURE_TEST, "outcome": "error", "ranks": [1], "message": planted}
        data["failed_tests"] = [failed]

    forge(out, blame_rank_1)
    assert verify_bundle(out).problems == (
        f"receipt.json: root_cause is {{'rank': 1, 'test': {SIGNATURE_TEST!r}, 'kind': {kind!r}}} "
        "but the rank records and JUnit reports say 'no cause: no rank record names a failure'",
    )


@pytest.mark.parametrize(
    ("cause", "first"),
    [
        (
            {"rank": 1, "kind": "killed", "message": "rank 1 died: it left no record"},
            "receipt.json: root_cause.rank is 1 but the rank records and JUnit reports say 0",
        ),
        (
            {"rank": None, "kind": "run", "message": "torchrun exited with code 1"},
            "receipt.json: root_cause.kind is 'run' but the rank records and JUnit reports say "
            "'killed'",
        ),
    ],
    ids=["another-rank", "no-rank"],
)
def test_the_root_cause_is_held_to_the_records_when_no_rank_left_one(
    tmp_path: Path, cause: dict[str, Any], first: str
) -> None:
    """Every rank died before writing its record: that they left none names the cause (rank 0,
    killed), which the receipt cannot move to another rank or off the ranks."""
    out = tmp_path / "no-records"
    out.mkdir()
    for rank in range(WORLD):
        write_rank(out, rank, WORLD, record=False, junit=False)
    torchrun_logs(out, WORLD)
    written = finalize_bundle(out, context(WORLD, exit_code=1))
    assert written.root_cause is not None
    assert (written.root_cause.rank, written.root_cause.kind) == (0, "killed")
    assert verify_bundle(out).ok, verify_bundle(out).problems
    forge(out, lambda d: d["root_cause"].update(cause))
    assert verify_bundle(out).problems == (first,)


STOP = Interruption(
    signal="SIGINT",
    at="2026-11-29T18:00:30Z",
    after_s=30.0,
    exit_code=130,
    tests_done=4,
    tests_collected=4,
)


@pytest.mark.parametrize(
    ("cause", "first"),
    [
        (
            {"rank": 1, "test": COMBINE_TEST, "kind": "interrupted", "message": STOP.message()},
            "receipt.json: root_cause.rank is 1 but the launcher's record of the launch "
            "(run.extra.launch.interrupted) says None",
        ),
        (
            {"rank": None, "test": None, "kind": "run", "message": STOP.message()},
            "receipt.json: root_cause.kind is 'run' but the launcher's record of the launch "
            "(run.extra.launch.interrupted) says 'interrupted'",
        ),
        (
            {"rank": None, "test": None, "kind": "interrupted", "message": "the operator"},
            "receipt.json: root_cause.message is 'the operator' but the launcher's record of "
            f"the launch (run.extra.launch.interrupted) says {STOP.message()!r}",
        ),
    ],
    ids=["blames-a-rank", "other-kind", "other-words"],
)
def test_an_interrupted_run_s_root_cause_is_its_interruption(
    tmp_path: Path, cause: dict[str, Any], first: str
) -> None:
    out = tmp_path / "interrupted"
    ctx = passing_run(out, world=WORLD)
    launch = Launch(exit_code=130, interrupted=STOP)
    written = finalize_bundle(
        out, dataclasses.replace(ctx, exit_code=130, extra=RunExtra(launch=launch))
    )
    assert written.root_cause is not None and written.root_cause.kind == "interrupted"
    assert verify_bundle(out).ok, verify_bundle(out).problems
    forge(out, lambda d: d.update(root_cause=cause))
    assert verify_bundle(out).problems[0] == first


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A passing bundle whose ranks ran the engine lane (the factory's qualifying record)."""
    from _support.evidence_factory import engine_record

    out = tmp_path_factory.mktemp("engine") / "bundle"
    out.mkdir()
    for rank in range(WORLD):
        write_rank(out, rank, WORLD, engine=engine_record())
    torchrun_logs(out, WORLD)
    finalize_bundle(out, context(WORLD))
    return out


def test_an_engine_lane_edited_in_the_receipt_is_held_to_the_records(
    engine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forger who hides a fallback (or claims capture ran) in `models.engine` and drops the
    `engine` limitation fools every layer but the re-derivation from the rank records."""
    assert receipt(engine)["models"]["engine"]["b12x_calls"] == {"decode": 16}

    def claim(data: dict[str, Any]) -> None:
        data["models"]["engine"]["other_calls"] = 0
        data["models"]["engine"]["b12x_calls"] = {"decode": 99}

    bundle = copy(engine, tmp_path)
    forge(bundle, claim)
    with monkeypatch.context() as patch:
        patch.setattr(verify, "rederive_problems", lambda *_: [])
        assert verify_bundle(bundle).ok
    problems = verify_bundle(bundle).problems
    assert problems and "models.engine.b12x_calls" in problems[0], problems


ENGINE_TEST = "suites/engine/test_engine.py::test_the_engine_ran"


@pytest.fixture(scope="module")
def engine_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A passing bundle of the engine lane alone: no suite ran the vendored warm code."""
    from _support.evidence_factory import engine_record

    out = tmp_path_factory.mktemp("engine-only") / "bundle"
    out.mkdir()
    for rank in range(WORLD):
        tests, engine = [passed(ENGINE_TEST)], engine_record()
        write_rank(  # no capture suite: no capture window, no capture-suite control
            out, rank, WORLD, tests=tests, collected=[ENGINE_TEST], captures=[], engine=engine
        )
    torchrun_logs(out, WORLD)
    finalize_bundle(out, context(WORLD))
    return out


def test_an_engine_only_run_owes_no_stand_in_limitations_and_verifies(engine_only: Path) -> None:
    stated = {key(x) for x in receipt(engine_only)["limitations"]}
    assert receipt(engine_only)["warm_impl"] == "vendored"  # the default no suite took up
    assert "warm-impl" not in stated and "real-trees" not in stated
    assert verify_bundle(engine_only).ok, verify_bundle(engine_only).problems


def test_a_receipt_that_claims_a_warm_suite_ran_is_held_to_the_junit(
    engine_only: Path, tmp_path: Path
) -> None:
    """Claiming a warmup suite ran makes the vendored copy's limitation owed, and the claim
    itself is held to the merged JUnit report."""

    def claim(data: dict[str, Any]) -> None:
        data["suites"]["warmup"] = {"passed": 1, "failed": 0, "skipped": 0, "errors": 0,
                                    "rank_cases": WORLD}  # fmt: skip

    bundle = copy(engine_only, tmp_path)
    forge(bundle, claim)
    problems = verify_bundle(bundle).problems
    assert any("suites.warmup" in p for p in problems), problems
    assert any("limitations do not name 'warm-impl'" in p for p in problems), problems


def test_the_engine_lanes_controls_are_the_runs_negative_controls(
    engine_only: Path, tmp_path: Path
) -> None:
    """An engine-only run ran no capture-suite control, but its lane's lazy-phase controls
    showed the detectors fire: they are counted, and no `negative-control` limitation is owed.
    A receipt that leaves them out is held to the records."""
    stated = receipt(engine_only)
    assert stated["negative_control"]["expected"] == WORLD == stated["negative_control"]["detected"]
    assert "negative-control" not in {key(x) for x in stated["limitations"]}

    def hide(data: dict[str, Any]) -> None:
        data["negative_control"].update(expected=0, detected=0)

    bundle = copy(engine_only, tmp_path)
    forge(bundle, hide)
    problems = verify_bundle(bundle).problems
    assert any("negative_control" in p for p in problems), problems


def test_a_cause_torchrun_reported_is_held_to_the_bundle_s_own_error_files(tmp_path: Path) -> None:
    """A cause of kind `torchrun` names the rank torchrun's error file names: moved to another
    rank, or claimed for a bundle that holds no such file, it does not verify."""
    bundle = crashed_on_the_way_out(tmp_path, note=True)

    def blame_rank_0(data: dict[str, Any]) -> None:
        data["root_cause"]["rank"] = 0

    forge(bundle, blame_rank_0)
    assert verify_bundle(bundle).problems == (
        "receipt.json: root_cause.rank is 0 but the rank records and JUnit reports say 1",
    )
    out = tmp_path / "exit-1"
    passing_run(out, world=WORLD)
    finalize_bundle(out, context(WORLD, exit_code=1))
    assert receipt(out)["root_cause"]["kind"] == "run"

    def claim_torchrun(data: dict[str, Any]) -> None:
        data["root_cause"] = {"rank": 1, "test": None, "kind": "torchrun", "message": "SIGSEGV"}

    forge(out, claim_torchrun)
    assert verify_bundle(out).problems == (
        "receipt.json: root_cause is {'rank': 1, 'test': None, 'kind': 'torchrun'} but the rank "
        "records and JUnit reports say 'no cause: no torchrun error file in the bundle'",
    )


@pytest.mark.parametrize("cause", ["records", "torchrun"])
def test_a_root_cause_reworded_as_a_flake_is_caught(tmp_path: Path, cause: str) -> None:
    """The summary's verdict line quotes the root cause's text: a failure the records (or
    torchrun's error file) name cannot be reworded as an infrastructure flake, its rank, test
    and kind kept."""
    bundle = (
        failed_combine(tmp_path)
        if cause == "records"
        else crashed_on_the_way_out(tmp_path, note=True)
    )
    real = receipt(bundle)["root_cause"]["message"]
    flake = "infrastructure flake: the store connection was reset (not a test failure)"
    forge(bundle, lambda d: d["root_cause"].update(message=flake))
    assert flake in (bundle / "summary.md").read_text()
    assert verify_bundle(bundle).problems == (
        f"receipt.json: root_cause.message is {flake!r} but the rank records and JUnit reports "
        f"say {real!r}",
    )


def test_a_fallback_root_cause_is_the_one_the_bundle_gives(tmp_path: Path) -> None:
    """A cause torchrun's error file names cannot be passed off as a bare exit code (kind `run`,
    a fallback verify held to nothing), and the verdict's first reason, where it is the cause,
    cannot be reworded."""
    bundle = crashed_on_the_way_out(tmp_path, note=True)
    flake = {"rank": None, "test": None, "kind": "run", "message": "infra flake: retry"}
    forge(bundle, lambda d: d.update(root_cause=flake))
    assert verify_bundle(bundle).problems == (
        "receipt.json: root_cause.kind is 'run' but the rank records and JUnit reports say "
        "'torchrun'",
    )
    out = tmp_path / "exit-1"
    passing_run(out, world=WORLD)
    finalize_bundle(out, context(WORLD, exit_code=1))
    real = receipt(out)["root_cause"]
    assert real["kind"] == "run"
    forge(out, lambda d: d["root_cause"].update(message="infra flake: retry"))
    assert verify_bundle(out).problems == (
        "receipt.json: root_cause.message is 'infra flake: retry' but the rank records and JUnit "
        f"reports say {real['message']!r}",
    )
