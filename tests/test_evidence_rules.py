"""Verdict, status and limitation rules, and the root-cause order."""

from __future__ import annotations

from pathlib import Path

import pytest
from _support.evidence_factory import (
    CAPTURE_TEST,
    CLEAN_CHECKOUT,
    COMBINE_TEST,
    DIRTY_CHECKOUT,
    NODES,
    SIGNATURE_TEST,
    failed,
    passed,
    write_rank,
)

from harness.evidence import rules
from harness.evidence.collect import find_root_cause, load_records
from harness.evidence.run_context import TorchrunFailure
from harness.schema.image import Image
from harness.schema.launch import Launch, NodeState, ZygoteState
from harness.schema.receipt import (
    Capture,
    Coverage,
    EngineLane,
    Environment,
    Geometry,
    Gpu,
    Models,
    NegativeControl,
    NodeZeroGone,
    Ranks,
    Run,
    RunExtra,
    Selection,
    Source,
    Tally,
    Verdict,
)

CPU = Environment(torch="2.13.0", cuda=None, nccl=None, device_names=["cpu"], python="3", host="h")
GPU = CPU.model_copy(update={"gpus": [Gpu(index=0, name="RTX PRO 6000")]})
NCCL = Geometry(world_size=16, nnodes=1, nproc_per_node=16, backend="nccl", tp=16, dcp=16)
GLOO = NCCL.model_copy(update={"backend": "gloo"})
# The engine lane as a qualifying GPU run leaves it: every rank of NCCL's 16 recorded its
# engine (one configuration, graphs on), vLLM's own warm and capture ran on every rank, b12x
# served the decode DCP calls, nothing fell back, tokens agree and equal eager.
ENGINE = EngineLane(
    ranks=list(range(16)),
    engines=[{"model": "kimi-k3", "tp": 16, "cudagraph_mode": "FULL_AND_PIECEWISE"}],
    warm_ran=True,
    capture_ran=True,
    controls=3,
    controls_caught=3,
    b12x_calls={"capture": 8, "decode": 16},
    tokens_agree=True,
    eager_equal=True,
)
REAL_TREES = Models(real=["kimi-k3"], engine=ENGINE)  # vLLM's own tree, saying nothing of itself
# One capture-suite control window, and the engine lane's lazy-phase controls folded in.
CONTROLS = NegativeControl(expected=1 + 3, detected=1 + 3, lazy_events=1 + 3)
LOCK_SHA = "cd" * 32
LOCKED = Image(
    reference="img",
    digest="sha256:" + "a" * 64,
    source_lock_sha256=LOCK_SHA,
    harness={"dirty": False},
    runtime={"ok": True, "lock_sha256": LOCK_SHA, "mismatches": []},
)
DIRTY_BUILD = Image(**(LOCKED.model_dump() | {"harness": {"dirty": True}}))
FAILED_CHECK = Image(
    **(
        LOCKED.model_dump()
        | {"runtime": {"ok": False, "lock_sha256": LOCK_SHA, "mismatches": ["torch 2.12"]}}
    )
)
GRAPHS = Capture(lazy_events=0, by_detector={}, per_rank={}, windows=2, paths={"cuda-graph": 2})
MIXED = Capture(
    lazy_events=0,
    by_detector={},
    per_rank={},
    windows=2,
    paths={"cuda-graph": 1, "cpu-simulated": 1},
)


WHOLE = Selection(targets=["/repo/suites"])
NARROWED = [
    Selection(targets=["/repo/suites"], deselected=1),
    Selection(targets=["/repo/suites/capture"], partial_targets=["/repo/suites/capture"]),
    Selection(targets=["/repo/suites"], ignored=["/repo/suites/transport"]),
]
# The facts of a single-node run that is all `qualified` asks for.
QUALIFYING: dict[str, object] = dict(
    geometry=NCCL,
    image=LOCKED,
    capture=GRAPHS,
    negative_control=CONTROLS,
    transports=["b12x"],
    ranks=Ranks(expected=16, reported=16, complete=16),
    sources={"dcpqual": CLEAN_CHECKOUT},
    selection=WHOLE,
    models=REAL_TREES,
    warm_impl="vllm",
)


def required_of(**changes: object) -> dict[str, str]:
    return rules.required_limitations(**(QUALIFYING | changes))  # type: ignore[arg-type]


def status(verdict: Verdict = "pass", env: Environment = GPU, **changes: object) -> str:
    return rules.status_of(verdict, env, required_of(**changes))


def test_a_run_with_every_path_run_is_qualified_and_admits_only_its_single_node() -> None:
    # every real-tree run admits that the layers' own forward did not run (`real-decode`)
    assert required_of().keys() == {"multi-node", "real-decode"}
    assert status() == "qualified"
    assert status("fail") == "not-qualified"
    assert status(env=CPU) == "source-qualified"


# Each change takes one thing `qualified` needs away; the key is the limitation it requires.
DENIED = [
    ({"geometry": GLOO}, "nccl"),
    ({"image": None}, "image"),
    ({"image": Image(reference="img")}, "image"),
    ({"image": DIRTY_BUILD}, "image"),
    ({"image": FAILED_CHECK}, "image"),
    ({"capture": MIXED}, "gpu-capture"),
    ({"capture": GRAPHS.model_copy(update={"windows": 0, "paths": {}})}, "gpu-capture"),
    *(({"selection": selection}, "selection") for selection in NARROWED),
    ({"transports": ["torch-dist"]}, "b12x-transport"),
    (
        {"negative_control": NegativeControl(expected=0, detected=0, lazy_events=0)},
        "negative-control",
    ),
    (
        {"capture": GRAPHS.model_copy(update={"inactive_detectors": {"cuda-memory": "no NVML"}})},
        "detectors",
    ),
    ({"models": REAL_TREES.model_copy(update={"engine": None})}, "engine"),
    ({"sources": {}}, "sources"),
    ({"sources": {"dcpqual": Source(version="0.1.0")}}, "sources"),
    ({"sources": {"dcpqual": DIRTY_CHECKOUT}}, "sources"),
    ({"ranks": Ranks(expected=16, reported=16, complete=16, missing_junit=[3])}, "ranks"),
    (
        {"coverage": Coverage(collected=4, skipped_everywhere=1, first_skipped_everywhere="t")},
        "skipped",
    ),
    (
        {
            "coverage": Coverage(
                collected=4, skipped_on_some_ranks=1, first_skipped_on_some_ranks="t"
            )
        },
        "skipped",
    ),
    ({"smoke": True}, "smoke"),
    (
        {"coverage": Coverage(collected=4, no_body=1, first_no_body="t")},
        "test-bodies",
    ),
    ({"node_zero_gone": NodeZeroGone(waited_s=3.0, by_node=1)}, "node-0"),
]


@pytest.mark.parametrize(("changes", "key"), DENIED)
def test_a_passing_gpu_run_that_must_admit_a_denying_limitation_is_source_qualified(
    changes: dict[str, object], key: str
) -> None:
    required = required_of(**changes)
    assert key in required and key in rules.DENIES_QUALIFIED
    assert rules.denying_limitations(required) == [key]
    assert status(**changes) == "source-qualified"
    assert status("fail", **changes) == "not-qualified"


def test_every_key_that_denies_qualified_is_one_the_rules_require() -> None:
    """A key in the set that no fact requires would deny nothing (a misspelt key, or a
    limitation renamed on one side only)."""
    assert {key for _, key in DENIED} == rules.DENIES_QUALIFIED
    assert not rules.DENIES_QUALIFIED & {"multi-node", "hash-seed"}


@pytest.mark.parametrize("selection", NARROWED, ids=["deselected", "partial-target", "ignored"])
def test_a_narrowed_selection_is_never_qualified_and_is_a_required_limitation(selection) -> None:
    assert status(selection=WHOLE) == "qualified"
    assert status(selection=selection) == "source-qualified"
    whole = required_of(selection=WHOLE)
    narrowed = required_of(selection=selection)
    assert "selection" not in whole
    assert set(narrowed) - set(whole) == {"selection"}
    assert rules.narrowing(selection)[0] in narrowed["selection"]


def reasons(**changes: object) -> list[str]:
    facts: dict[str, object] = dict(
        suites={"capture": Tally(passed=3)},
        capture=GRAPHS,
        negative_control=NegativeControl(expected=1, detected=1, lazy_events=1),
        signatures=[],
        ranks=Ranks(expected=16, reported=16, complete=16),
        run=Run(),
    )
    facts.update(changes)
    return rules.failure_reasons(**facts)  # type: ignore[arg-type]


def test_a_clean_run_has_no_failure_reasons() -> None:
    assert reasons() == [] and rules.verdict_of([]) == "pass"


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"run": Run(exit_code=1)}, "torchrun exited with code 1"),
        ({"run": Run(timed_out=True)}, "timed out"),
        (
            {"run": Run(extra=RunExtra(launch=Launch(leftovers=[41, 42])))},
            "2 processes were still running after torchrun exited (pids 41, 42)",
        ),
        ({"ranks": Ranks(expected=16, reported=15, complete=15, killed=[3])}, "ranks [3]"),
        ({"suites": {"capture": Tally(passed=1, failed=1)}}, "1 failed and 0 erroring"),
        ({"suites": {"capture": Tally(passed=1, errors=2)}}, "0 failed and 2 erroring"),
        ({"suites": {"capture": Tally(skipped=4)}}, "no test passed"),
        ({"suites": {}}, "no test passed"),
        (
            {
                "negative_control": NegativeControl(
                    expected=2, detected=1, lazy_events=1, missed=["r"]
                )
            },
            "1 of 2 negative-control windows went undetected",
        ),
    ],
)
def test_each_failure_is_a_reason(changes: dict[str, object], reason: str) -> None:
    found = reasons(**changes)
    assert any(reason in r for r in found), found
    assert rules.verdict_of(found) == "fail"


def test_required_limitations_follow_the_facts() -> None:
    def required(**changes: object) -> set[str]:
        facts: dict[str, object] = dict(
            geometry=NCCL.model_copy(update={"nnodes": 2, "nproc_per_node": 8}),
            image=LOCKED,
            capture=GRAPHS,
            negative_control=CONTROLS,
            transports=["b12x"],
            ranks=Ranks(expected=16, reported=16, complete=16),
            sources={},
            models=REAL_TREES,
            warm_impl="vllm",
        )
        facts.update(changes)
        return set(rules.required_limitations(**facts))  # type: ignore[arg-type]

    # no git identity for the harness in this fake; a real tree's layers never run forward
    assert required() == {"sources", "real-decode"}
    assert "real-trees" in required(models=Models())
    assert "warm-impl" in required(warm_impl="vendored")
    assert "gpu-capture" in required(capture=MIXED)
    assert "nccl" in required(geometry=GLOO.model_copy(update={"nnodes": 2, "nproc_per_node": 8}))
    assert "b12x-transport" in required(transports=["torch-dist"])
    assert "image" in required(image=None)
    assert "image" in required(image=Image(reference="img"))
    assert "multi-node" in required(geometry=NCCL)
    assert "negative-control" in required(
        negative_control=NegativeControl(expected=0, detected=0, lazy_events=0)
    )
    shared = ZygoteState(used=True, forked=16, hash_seed="shared-random")
    assert "hash-seed" in required(zygote=shared)
    assert "hash-seed" not in required(zygote=shared.model_copy(update={"hash_seed": "fixed"}))
    cold = ZygoteState(used=False, forked=0, not_used="threads alive", hash_seed="per-rank-random")
    assert "hash-seed" not in required(zygote=cold)
    missing = rules.missing_limitations(["nccl", "image"], {"nccl": "", "b12x-transport": ""})
    assert missing == ["b12x-transport"]


def test_another_nodes_zygote_requires_the_hash_seed_limitation_too() -> None:
    """Node 0's launch speaks for node 0 only: a second node's marker says how its ranks
    started, and a zygote there whose ranks share its seed needs the limitation as well."""
    shared = ZygoteState(used=True, forked=8, hash_seed="shared-random")
    cold = ZygoteState(used=False, forked=0, not_used="threads alive", hash_seed="per-rank-random")

    def marker(node: int, zygote: ZygoteState | None) -> NodeState:
        return NodeState(
            node_rank=node, nnodes=2, rdzv_endpoint="n0:1", state="finished", zygote=zygote
        )

    assert rules.hash_seed_limitation(cold, {"0": marker(0, cold), "1": marker(1, cold)}) == {}
    said = rules.hash_seed_limitation(cold, {"0": marker(0, cold), "1": marker(1, shared)})
    assert "8 rank(s)" in said["hash-seed"] and "node(s) 1)" in said["hash-seed"]
    both = rules.hash_seed_limitation(shared, {"0": marker(0, shared), "1": marker(1, shared)})
    assert "16 rank(s)" in both["hash-seed"] and "node(s) 0, 1)" in both["hash-seed"]
    assert rules.hash_seed_limitation(cold, {"1": None}) == {}  # a node that left no marker


def test_processes_another_node_left_fail_the_run_too() -> None:
    """Node 0's launch names its own leftovers only; another node's are in its marker."""

    def marker(node: int, leftovers: list[int]) -> NodeState:
        return NodeState(
            node_rank=node, nnodes=2, rdzv_endpoint="n0:1", state="finished", leftovers=leftovers
        )

    clean = {"0": marker(0, []), "1": marker(1, [])}
    assert reasons(run=Run(extra=RunExtra(launch=Launch(), nodes=clean))) == []
    dirty = {"0": marker(0, [41]), "1": marker(1, [77, 78])}
    [reason] = reasons(run=Run(extra=RunExtra(launch=Launch(leftovers=[41]), nodes=dirty)))
    assert reason.startswith(
        "3 processes were still running after torchrun exited (pids 41 on node 0; 77, 78 on node 1)"
    ), reason


def test_root_cause_is_the_earliest_primary_failure(tmp_path: Path) -> None:
    # rank 3 fails the combine test (2nd) on its own; rank 1 fails the capture test (3rd) later;
    # peers of rank 3 report follow-on failures that must not be blamed on themselves.
    for rank in range(4):
        tests = [passed(n) for n in NODES]
        if rank == 3:
            tests[1] = failed(COMBINE_TEST, "primary")
        else:
            tests[1] = failed(COMBINE_TEST, "peer 3 failed", primary=False, by=[3])
        if rank == 1:
            tests[2] = failed(CAPTURE_TEST, "later")
        write_rank(tmp_path, rank, 4, tests=tests)
    cause = find_root_cause(load_records(tmp_path, 4), timed_out=False, torchrun_error=None)
    assert cause is not None
    assert (cause.rank, cause.test, cause.message) == (3, COMBINE_TEST, "primary")


def test_killed_rank_before_a_later_failure_is_the_root_cause(tmp_path: Path) -> None:
    for rank in range(2):
        tests = [passed(n) for n in NODES]
        tests[3] = failed(NODES[3], "late failure")
        write_rank(tmp_path, rank, 3, tests=tests)
    write_rank(tmp_path, 2, 3, tests=[passed(SIGNATURE_TEST)], complete=False, junit=False)
    error = TorchrunFailure(rank=2, message="RuntimeError: boom")
    cause = find_root_cause(load_records(tmp_path, 3), timed_out=False, torchrun_error=error)
    assert cause is not None and (cause.rank, cause.test, cause.kind) == (2, COMBINE_TEST, "killed")
    assert "RuntimeError: boom" in cause.message


def test_root_cause_falls_back_to_torchrun_then_junit_then_reasons(tmp_path: Path) -> None:
    for rank in range(2):
        write_rank(tmp_path, rank, 2)
    ranks = load_records(tmp_path, 2)
    error = TorchrunFailure(rank=1, message="exit code 3")
    cause = find_root_cause(ranks, timed_out=False, torchrun_error=error)
    assert cause is not None and (cause.rank, cause.kind) == (1, "torchrun")
    cause = find_root_cause(
        ranks, timed_out=False, torchrun_error=None, junit_failures=[(0, "m::t", "bad")]
    )
    assert cause is not None and (cause.rank, cause.test, cause.kind) == (0, "m::t", "junit")
    cause = find_root_cause(ranks, timed_out=False, torchrun_error=None, reasons=["exit 1"])
    assert cause is not None and (cause.rank, cause.message, cause.kind) == (None, "exit 1", "run")
    assert find_root_cause(ranks, timed_out=False, torchrun_error=None) is None


def test_at_the_same_test_a_primary_failure_beats_a_killed_rank(tmp_path: Path) -> None:
    tests = [passed(n) for n in NODES]
    tests[2] = failed(CAPTURE_TEST, "lazy transport")
    write_rank(tmp_path, 0, 2, tests=tests)
    write_rank(tmp_path, 1, 2, tests=tests[:2], complete=False, junit=False)  # died in it
    cause = find_root_cause(load_records(tmp_path, 2), timed_out=False, torchrun_error=None)
    assert cause is not None
    assert (cause.rank, cause.test, cause.kind) == (0, CAPTURE_TEST, "test")


def test_a_consequence_at_an_earlier_test_never_beats_its_cause(tmp_path: Path) -> None:
    """Lanes of sub-world cases run different cases at once: ranks 0-1 were in the combine test
    (2nd) when rank 2, in the capture test (3rd) of the other lane, timed out and the job was
    ended; their non-primary endings are consequences, however early their test."""
    for rank in (0, 1):
        tests = [passed(SIGNATURE_TEST), failed(COMBINE_TEST, "stopped", primary=False)]
        write_rank(tmp_path, rank, 4, tests=tests, complete=False, junit=False)
    lane = [passed(SIGNATURE_TEST), passed(COMBINE_TEST)]
    write_rank(tmp_path, 2, 4, tests=[*lane, failed(CAPTURE_TEST, "timed out")], complete=False)
    write_rank(tmp_path, 3, 4, tests=[*lane, failed(CAPTURE_TEST, "peer", primary=False, by=[2])])
    cause = find_root_cause(load_records(tmp_path, 4), timed_out=False, torchrun_error=None)
    assert cause is not None
    assert (cause.rank, cause.test, cause.message) == (2, CAPTURE_TEST, "timed out")


def _engine(**changes: object) -> Models:
    return REAL_TREES.model_copy(update={"engine": ENGINE.model_copy(update=changes)})


@pytest.mark.parametrize(
    ("models", "says"),
    [
        (REAL_TREES.model_copy(update={"engine": None}), "the engine lane did not run"),
        (_engine(capture_ran=False), "vLLM's own capture"),
        (_engine(warm_ran=False), "vLLM's own warm"),
        (_engine(b12x_calls={"capture": 8}), "served no decode DCP call"),
        (_engine(other_calls=2), "2 DCP calls took another path"),
        (_engine(engines=[{"cudagraph_mode": "NONE"}]), "ran without CUDA graphs"),
        (
            _engine(engines=[{"cudagraph_mode": "FULL", "graphs": ["captured=0"]}]),
            "ran without CUDA graphs",
        ),
    ],
)
def test_qualified_needs_the_engine_lane_capture_b12x_decode_and_no_fallback(
    models: Models, says: str
) -> None:
    assert status(models=models) == "source-qualified"
    assert says in required_of(models=models)["engine"]


def test_the_engine_lanes_own_limitations_are_required_by_their_keys() -> None:
    from harness.schema.base import Limitation

    models = _engine(limitations=[Limitation(key="engine-dcp", text="ran at DCP1")])
    assert required_of(models=models)["engine-dcp"] == "ran at DCP1"


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"lazy_events": 1}, "1 lazy events inside vLLM's own capture"),
        ({"controls_caught": 2}, "1 of 3 engine-lane negative controls went undetected"),
        ({"controls_false": 1}, "controls before capture were called lazy"),
        ({"tokens_agree": False}, "differ across ranks"),
        ({"eager_equal": False}, "enforce_eager"),
    ],
)
def test_engine_lane_records_fail_the_verdict(changes: dict[str, object], says: str) -> None:
    assert any(says in r for r in rules.engine_failures(_engine(**changes)))
    assert rules.engine_failures(REAL_TREES) == []
    assert rules.engine_failures(Models()) == []


def test_a_test_whose_body_never_ran_fails_the_run_and_is_named() -> None:
    """Setup and teardown passing prove nothing of a test: a run with such a test fails."""
    coverage = Coverage(collected=4, no_body=2, first_no_body="suites/x/test_a.py::t")
    said = reasons(coverage=coverage)
    assert any("no test body ran for 2 test(s)" in r and "test_a.py::t" in r for r in said)
    assert reasons(coverage=Coverage(collected=4)) == []


def test_the_warm_code_limits_a_run_only_where_a_suite_that_runs_it_ran() -> None:
    ran, skipped = Tally(passed=2, rank_cases=4), Tally(skipped=3, rank_cases=6)
    failed = Tally(failed=1, rank_cases=2)
    vendored = {"warm_impl": "vendored"}
    for suite in sorted(rules.WARM_SUITES):
        assert "warm-impl" in required_of(suites={suite: ran}, **vendored)
    assert "warm-impl" in required_of(suites={"warmup": failed}, **vendored)
    assert "warm-impl" in required_of(suites=None, **vendored)  # not known: assumed
    assert "warm-impl" in required_of(suites={}, smoke=True, **vendored)  # the smoke warms
    # An engine-lane run: vLLM's own warm in the engine, the vendored copy nowhere.
    engine_only = {"engine": ran, "transport": ran, "warmup": skipped}
    assert "warm-impl" not in required_of(suites=engine_only, **vendored)
    assert "warm-impl" not in required_of(suites={}, **vendored)
    assert "warm-impl" not in required_of(suites={"capture": ran})  # vLLM's own warm


def test_the_stand_in_tree_limitation_needs_a_stand_in_to_have_run() -> None:
    engine_only = Models(engine=ENGINE)  # no real tree; the engine built vLLM's own classes
    suites = {"engine": Tally(passed=1), "transport": Tally(passed=1)}
    assert "real-trees" not in required_of(models=engine_only, suites=suites)
    with_stand_ins = suites | {"capture": Tally(passed=1)}
    assert "real-trees" in required_of(models=engine_only, suites=with_stand_ins)
    assert "real-trees" in required_of(models=Models(), suites=suites)  # no engine: nothing real
    assert "real-trees" in required_of(models=engine_only, suites=None)


def test_the_warm_suites_are_the_suite_folders_whose_tests_take_the_warm_code(
    repo_root: Path,
) -> None:
    """An oracle by text, not by the rule: a suite folder whose files name the warm code."""
    suites = repo_root / "suites"
    taking = {
        p.relative_to(suites).parts[0]
        for p in suites.glob("*/*.py")
        if "warm_impl" in p.read_text()
    }
    assert taking == rules.WARM_SUITES


def test_the_engine_lanes_controls_stand_in_only_where_no_capture_window_ran() -> None:
    """ENGINE has 3 lazy-phase controls, folded into `negative_control` with the capture
    suite's; only the capture suite's show the capture windows' detectors firing."""
    only_engine = NegativeControl(expected=3, detected=3, lazy_events=3)
    with_capture = NegativeControl(expected=4, detected=4, lazy_events=4)
    assert "negative-control" in required_of(negative_control=only_engine)  # GRAPHS: 2 windows
    assert (
        "the engine lane's 3 controls"
        in required_of(negative_control=only_engine)["negative-control"]
    )
    assert "negative-control" not in required_of(negative_control=with_capture)
    no_window = Capture(lazy_events=0, by_detector={}, per_rank={}, windows=0)
    assert "negative-control" not in required_of(capture=no_window, negative_control=only_engine)
    none = NegativeControl(expected=0, detected=0, lazy_events=0)
    assert "negative-control" in required_of(capture=no_window, negative_control=none)


def test_an_engine_that_captured_graphs_is_not_short_of_them() -> None:
    """Negative control of the graph rule: graphs on and counted is no shortfall."""
    captured = _engine(engines=[{"cudagraph_mode": "FULL_AND_PIECEWISE", "graphs": ["captured=4"]}])
    assert "engine" not in required_of(models=captured)


def test_every_rank_of_the_world_must_have_recorded_its_engine() -> None:
    """The lane's facts are over the ranks that left an engine record: a rank that left none
    (or a record of a rank outside the world) would leave its engine unjudged."""
    fewer = _engine(ranks=list(range(15)))
    assert status(models=fewer) == "source-qualified"
    assert required_of(models=fewer)["engine"] == (
        "ranks 15 of the 16-rank world left no engine record: what their engines did was not judged"
    )
    many = required_of(models=_engine(ranks=[0, 1]))["engine"]
    assert many.startswith("ranks 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and 4 more of the 16-rank")
    stranger = _engine(ranks=[*range(16), 16])
    assert status(models=stranger) == "source-qualified"
    assert required_of(models=stranger)["engine"] == (
        "engine records of ranks 16, not of this run's world"
    )


def test_an_engine_lane_naming_no_engine_does_not_back_qualified() -> None:
    """No configuration: the graph rule (every engine captured graphs) would hold vacuously."""
    nameless = _engine(engines=[])
    assert status(models=nameless) == "source-qualified"
    assert required_of(models=nameless)["engine"] == (
        "the engine lane names no engine configuration: its graphs are not known"
    )


def test_a_smoke_is_excused_the_lanes_absence_but_not_a_lanes_own_facts() -> None:
    from harness.schema.base import Limitation

    assert "engine" not in required_of(models=Models(), smoke=True)
    lane = _engine(ranks=[0], limitations=[Limitation(key="engine-dcp", text="ran at DCP1")])
    said = required_of(models=lane, smoke=True)
    assert said["engine-dcp"] == "ran at DCP1" and "ranks 1, 2" in said["engine"]
