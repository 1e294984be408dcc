"""The rules' words and bounds, pinned whole: each reason and limitation a receipt carries is
compared by verify against the rules' own text, so a changed word, a dropped clause or a bound
moved by one is a change of what every receipt says (and of what an older one must have said).
The expected texts here are written out, not built from the rules' code."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from harness.evidence import rules
from harness.schema.base import Limitation
from harness.schema.image import Image
from harness.schema.launch import Interruption, Launch, NodeState, ZygoteState
from harness.schema.rank_record import RealTree
from harness.schema.receipt import (
    Capture,
    Coverage,
    EngineLane,
    Geometry,
    HashSeed,
    Models,
    NegativeControl,
    NodeZeroGone,
    Ranks,
    Run,
    RunExtra,
    Scrub,
    Selection,
    SignatureRow,
    Source,
    Stray,
    Tally,
)

CLEAN = Source(version="0.1.0", commit="1" * 40, tree="2" * 40, dirty=False)
LOCK = "cd" * 32
LOCKED = Image.model_validate(
    {
        "reference": "img",
        "digest": "sha256:" + "a" * 64,
        "source_lock_sha256": LOCK,
        "harness": {"dirty": False},
        "runtime": {"ok": True, "lock_sha256": LOCK, "mismatches": []},
    }
)
GRAPHS = Capture(lazy_events=0, by_detector={}, per_rank={}, windows=2, paths={"cuda-graph": 2})
WORLD = 4
NCCL = Geometry(world_size=WORLD, nnodes=2, nproc_per_node=2, backend="nccl", tp=4, dcp=4)
ENGINE = EngineLane(
    ranks=list(range(WORLD)),
    engines=[{"cudagraph_mode": "FULL", "graphs": ["captured=4"]}],
    warm_ran=True,
    capture_ran=True,
    controls=2,
    controls_caught=2,
    b12x_calls={"decode": 4},
    tokens_agree=True,
    eager_equal=True,
)
TREES = Models(real=["kimi-k3"], engine=ENGINE)
# Two nodes, everything qualified asks for: the rules require the real trees' decode only.
FACTS: dict[str, object] = dict(
    geometry=NCCL,
    image=LOCKED,
    capture=GRAPHS,
    negative_control=NegativeControl(expected=3, detected=3, lazy_events=3),
    transports=["b12x"],
    ranks=Ranks(expected=WORLD, reported=WORLD, complete=WORLD),
    sources={"dcpqual": CLEAN},
    models=TREES,
    warm_impl="vllm",
    suites={"capture": Tally(passed=1)},
)
REAL_DECODE = (
    "on the real trees the decode step calls each layer's own dcp_manager.query_gather and "
    "combine (routed through the transport registry: vLLM's combines are Triton-only) with "
    "queries shaped as MLADCPManager was built; the layers' forward (paged KV cache, "
    "forward_mqa, W_UK/W_UV) did not run"
)


def required(**changes: object) -> dict[str, str]:
    return rules.required_limitations(**(FACTS | changes))  # type: ignore[arg-type]


def said(key: str, **changes: object) -> str:
    return required(**changes)[key]


def test_the_reference_facts_require_only_the_real_trees_decode() -> None:
    assert required() == {"real-decode": REAL_DECODE}


# -- required limitations, each text whole ------------------------------------------------------


def test_the_smoke_and_the_geometry_limitations() -> None:
    assert said("smoke", smoke=True) == (
        "a one-GPU smoke of the GPU paths (CUDA-graph capture window, GPU detectors, NCCL group "
        "creation), not a qualification; geometry tp=1/dcp=1 is its single rank"
    )
    gloo = NCCL.model_copy(update={"backend": "gloo"})
    assert said("nccl", geometry=gloo) == "NCCL did not run: the backend was gloo"
    one = NCCL.model_copy(update={"nnodes": 1, "nproc_per_node": WORLD})
    assert said("multi-node", geometry=one) == (
        "single node: multi-node rendezvous (c10d) was not exercised"
    )
    assert "multi-node" not in required()


def test_the_capture_limitations() -> None:
    none = GRAPHS.model_copy(update={"windows": 0, "paths": {}})
    assert said("gpu-capture", capture=none) == (
        "no capture window ran, so no capture was checked at all"
    )
    mixed = GRAPHS.model_copy(update={"windows": 5, "paths": {"cuda-graph": 2, "cpu": 3}})
    assert said("gpu-capture", capture=mixed) == (
        "GPU CUDA-graph capture did not run for 3 of 5 capture windows (cpu-simulated); lazy "
        "work only a GPU shows (device memory growth, NCCL communicator init, Triton/b12x JIT) "
        "was not observed there"
    )
    cpu = GRAPHS.model_copy(update={"paths": {"cpu-simulated": 2}})
    assert said("gpu-capture", capture=cpu).startswith("GPU CUDA-graph capture did not run for 2 ")
    deaf = GRAPHS.model_copy(update={"inactive_detectors": {"nvml": "no NVML", "gc": "off"}})
    assert said("detectors", capture=deaf) == (
        "these detectors did not watch every capture window: nvml (no NVML); gc (off)"
    )


def test_gpu_capture_only_needs_windows_that_all_were_graphs() -> None:
    assert rules.gpu_capture_only(GRAPHS)
    one = GRAPHS.model_copy(update={"windows": 1, "paths": {"cuda-graph": 1}})
    assert rules.gpu_capture_only(one)
    assert not rules.gpu_capture_only(one.model_copy(update={"paths": {"cpu-simulated": 1}}))
    assert not rules.gpu_capture_only(GRAPHS.model_copy(update={"windows": 0, "paths": {}}))
    assert not rules.gpu_capture_only(GRAPHS.model_copy(update={"paths": {"cuda-graph": 1}}))
    assert not rules.gpu_capture_only(GRAPHS.model_copy(update={"paths": {}}))
    assert not rules.gpu_capture_only(GRAPHS.model_copy(update={"paths": {"cuda-graph": 3}}))


def test_the_transport_and_image_limitations() -> None:
    assert said("b12x-transport", transports=["torch-dist", "gloo"]) == (
        "the b12x PCIe transport did not run (transports: torch-dist, gloo); its pool creation, "
        "IPC handle exchange and kernel compilation were not exercised"
    )
    assert said("b12x-transport", transports=[]).startswith(
        "the b12x PCIe transport did not run (transports: none reported); "
    )
    assert said("image", image=None) == (
        "no image: the run used a source checkout; the image build and the in-image identity "
        "check (torch, CUDA, NCCL, component commits and trees) did not run"
    )
    unnamed = Image.model_validate(
        LOCKED.model_dump() | {"reference": None, "digest": None, "harness": {"dirty": True}}
    )
    assert said("image", image=unnamed) == (
        "image (unnamed) cannot qualify: image digest is missing; image was built from a dirty "
        "harness tree"
    )
    named = LOCKED.model_copy(update={"digest": None})
    assert said("image", image=named).startswith("image img cannot qualify: ")


def test_the_negative_control_limitations() -> None:
    none = NegativeControl(expected=0, detected=0, lazy_events=0)
    assert said("negative-control", negative_control=none) == (
        "no negative-control window ran: the lazy-work detectors were not shown to fire"
    )
    engine_only = NegativeControl(expected=2, detected=2, lazy_events=2)  # ENGINE's two
    assert said("negative-control", negative_control=engine_only) == (
        "no negative-control window ran beside the 2 capture windows, only the engine lane's 2 "
        "controls: the capture windows' detectors were not shown to fire"
    )
    assert "negative-control" not in required(
        negative_control=NegativeControl(expected=1, detected=1, lazy_events=1),
        models=TREES.model_copy(update={"engine": None}),
    )  # no engine lane: its one window is the capture suite's


def test_the_ranks_limitation() -> None:
    killed = Ranks(expected=WORLD, reported=3, complete=2, killed=[1, 3], stopped=[3])
    assert said("ranks", ranks=killed) == (
        "ranks [1, 3] did not finish, their records are partial or gone (ranks [3] say they "
        "were stopped by the run's fault)"
    )
    unstopped = Ranks(expected=WORLD, reported=3, complete=3, killed=[2])
    assert said("ranks", ranks=unstopped) == (
        "ranks [2] did not finish, their records are partial or gone"
    )
    junit = Ranks(expected=WORLD, reported=WORLD, complete=WORLD, missing_junit=[0])
    assert said("ranks", ranks=junit) == (
        "ranks [0] left no readable JUnit report; their cases in junit/merged.xml were rebuilt "
        "from their records"
    )
    both = Ranks(expected=WORLD, reported=3, complete=3, killed=[2], missing_junit=[2])
    assert said("ranks", ranks=both) == (
        "ranks [2] did not finish, their records are partial or gone; ranks [2] left no "
        "readable JUnit report; their cases in junit/merged.xml were rebuilt from their records"
    )


def test_the_sources_limitation() -> None:
    uncommitted = "the harness is not a git checkout: no commit or tree identifies it"
    assert said("sources", sources={}) == uncommitted
    assert said("sources", sources={"dcpqual": Source(version="0.1")}) == uncommitted
    dirty = CLEAN.model_copy(update={"dirty": True, "dirty_paths": ["a", "b", "c", "d"]})
    assert said("sources", sources={"dcpqual": dirty}) == (
        "the harness checkout was dirty (e.g. a, b, c): commit and tree do not fully identify "
        "the code that ran"
    )


def test_the_warm_impl_limitation() -> None:
    assert said("warm-impl", warm_impl="vendored") == (
        "the warm code qualified is the 'vendored' copy, not vLLM's own"
    )


def test_a_warm_suite_that_ran_anything_but_skips_counts() -> None:
    ran = (Tally(passed=1), Tally(failed=1), Tally(errors=1))
    for tally in (*ran, Tally(passed=1, failed=1), Tally(failed=1, errors=1)):
        assert rules.warm_code_ran({"warmup": tally})
    assert not rules.warm_code_ran({"warmup": Tally(skipped=5)})
    assert not rules.warm_code_ran({"engine": Tally(passed=5)})
    assert not rules.warm_code_ran({})
    assert rules.warm_code_ran(None)
    assert rules.warm_code_ran({}, smoke=True)


def test_the_real_tree_limitations() -> None:
    without = Models()
    assert said("real-trees", models=without, sources={"dcpqual": CLEAN}) == (
        "vLLM is not installed, so no real vLLM tree was built: only stand-in model classes "
        "ran, not vLLM's own"
    )
    vllm = {"dcpqual": CLEAN, "vllm": Source(version="0.32.0")}
    assert said("real-trees", models=without, sources=vllm) == (
        "vLLM 0.32.0 is installed but the run built none of its trees (--models stand-in, or no "
        "selected test built one): only stand-in model classes ran, not vLLM's own"
    )
    unversioned = {"dcpqual": CLEAN, "vllm": Source(commit="3" * 40)}
    assert said("real-trees", models=without, sources=unversioned).startswith(
        "vLLM is installed but the run built none of its trees"
    )


def test_each_real_tree_says_of_itself_once_what_several_say_alike() -> None:
    def tree(*items: tuple[str, str]) -> RealTree:
        return RealTree(
            model="kimi-k3",
            tp=WORLD,
            dcp=WORLD,
            kv_cache_dtype="auto",
            dcp_comm_backend="ag_rs",
            limitations=tuple(Limitation(key=k, text=t) for k, t in items),
        )

    models = TREES.model_copy(
        update={
            "trees": [
                tree(("shims", "ran under shim A"), ("real-decode", "no paged cache")),
                tree(("shims", "ran under shim A"), ("shims", "ran under shim B")),
            ]
        }
    )
    got = required(models=models)
    assert got["shims"] == "ran under shim A; ran under shim B"
    assert got["real-decode"] == f"{REAL_DECODE}; no paged cache"


def test_a_real_tree_limitation_joins_one_the_run_already_requires() -> None:
    dirty = CLEAN.model_copy(update={"dirty": True, "dirty_paths": ["x"]})
    tree = RealTree(
        model="kimi-k3",
        tp=WORLD,
        dcp=WORLD,
        kv_cache_dtype="auto",
        dcp_comm_backend="ag_rs",
        limitations=(Limitation(key="sources", text="vLLM dirty"),),
    )
    got = said(
        "sources", sources={"dcpqual": dirty}, models=TREES.model_copy(update={"trees": [tree]})
    )
    assert got == (
        "the harness checkout was dirty (e.g. x): commit and tree do not fully identify the "
        "code that ran; vLLM dirty"
    )


def test_the_stand_in_limitation_is_left_out_only_for_an_engine_only_run() -> None:
    engine_only = Models(engine=ENGINE)
    lanes = {"engine": Tally(passed=1)}
    assert "real-trees" not in required(models=engine_only, suites=lanes)
    assert "real-trees" in required(models=Models(), suites=lanes)
    assert "real-trees" in required(models=engine_only, suites={"warmup": Tally(passed=1)})
    assert "real-decode" in required(
        models=TREES.model_copy(update={"engine": ENGINE}), suites=lanes
    )


def test_the_skip_and_body_limitations() -> None:
    everywhere = Coverage(collected=4, skipped_everywhere=2, first_skipped_everywhere="t::a")
    assert said("skipped", coverage=everywhere) == (
        "2 test(s) skipped on every rank, so they proved nothing (the first: t::a)"
    )
    some = Coverage(collected=4, skipped_on_some_ranks=1, first_skipped_on_some_ranks="t::b")
    assert said("skipped", coverage=some) == (
        "1 test(s) skipped on some ranks and ran on others (the first: t::b)"
    )
    both = everywhere.model_copy(
        update={"skipped_on_some_ranks": 1, "first_skipped_on_some_ranks": "t::b"}
    )
    assert said("skipped", coverage=both) == (
        "2 test(s) skipped on every rank, so they proved nothing (the first: t::a); 1 test(s) "
        "skipped on some ranks and ran on others (the first: t::b)"
    )
    assert "skipped" not in required(coverage=Coverage(collected=4))
    bodiless = Coverage(collected=4, no_body=3, first_no_body="t::c")
    assert said("test-bodies", coverage=bodiless) == (
        "no test body ran for 3 test(s): pytest skipped their call phase (--setup-only, "
        "--setup-plan or a hook), the first t::c"
    )
    assert "test-bodies" not in required(coverage=Coverage(collected=4))


def test_the_selection_limitation_names_every_narrowing_and_the_first_three_of_each() -> None:
    many = ["a", "b", "c", "d", "e"]
    selection = Selection(
        targets=["suites/x"],
        partial_targets=many,
        deselected=2,
        ignored=many,
        unreached=["u"],
        outside=many[:3],
        removed=1,
        rules=many,
    )
    assert said("selection", selection=selection) == (
        "the run selected less than the suites hold, so it qualifies only what ran: "
        "pytest targets other than the whole suites/ folder: a, b, c and 2 more; "
        "2 collected tests deselected (-k, -m or --deselect); "
        "paths left out with --ignore: a, b, c; "
        "files of the harness's suites/ that gave no test: u; "
        "tests collected from outside the harness's suites/: a, b, c; "
        "1 collected tests taken away without being deselected; "
        "collection rules not the harness's: a; b; c"
    )
    assert rules.narrowing(None) == []
    assert rules.narrowing(Selection(targets=["suites"])) == []
    assert "selection" not in required(selection=Selection(targets=["suites"]))
    assert rules.narrowing(Selection(partial_targets=["a", "b", "c", "d"])) == [
        "pytest targets other than the whole suites/ folder: a, b, c and 1 more"
    ]
    assert rules.narrowing(Selection(targets=["suites"], unreached=["a", "b", "c", "d"])) == [
        "files of the harness's suites/ that gave no test: a, b, c and 1 more"
    ]
    assert rules.narrowing(Selection(targets=["suites"], outside=["a", "b", "c", "d"])) == [
        "tests collected from outside the harness's suites/: a, b, c and 1 more"
    ]


def test_the_engine_limitation_names_every_shortfall_in_order() -> None:
    short = ENGINE.model_copy(
        update={
            "ranks": [0, 1, 5],
            "engines": [],
            "warm_ran": False,
            "capture_ran": False,
            "b12x_calls": {"capture": 3},
            "other_calls": 2,
        }
    )
    assert said("engine", models=TREES.model_copy(update={"engine": short})) == (
        "ranks 2, 3 of the 4-rank world left no engine record: what their engines did was not "
        "judged; engine records of ranks 5, not of this run's world; the engine lane names no "
        "engine configuration: its graphs are not known; not every engine rank ran vLLM's own "
        "warm (compile_or_warm_up_model); not every engine rank ran vLLM's own capture (the "
        "model runner's capture_model); the b12x transport served no decode DCP call; 2 DCP "
        "calls took another path than b12x (a fallback)"
    )
    assert said("engine", models=TREES.model_copy(update={"engine": None})) == (
        "the engine lane did not run (--models engine): the installed vLLM's own startup (its "
        "warm, its CUDA-graph capture, its decode steps) was not qualified"
    )
    graphless = ENGINE.model_copy(update={"engines": [{"cudagraph_mode": "none"}]})
    assert said("engine", models=TREES.model_copy(update={"engine": graphless})) == (
        "an engine ran without CUDA graphs (cudagraph_mode NONE, or vLLM counted no captured "
        "graph): its capture_model captured nothing, so replay was not qualified"
    )


@pytest.mark.parametrize(
    "engine",
    [
        {"cudagraph_mode": "FULL", "graphs": ["captured=4"]},
        {"cudagraph_mode": "FULL", "graphs": "captured=0"},  # not vLLM's list of counts
        {"cudagraph_mode": "FULL"},
        {"cudagraph_mode": "FULL", "graphs": ["mode=FULL", "captured=10"]},
    ],
)
def test_an_engine_with_graphs_or_a_count_it_cannot_read_is_not_short_of_graphs(
    engine: dict[str, object],
) -> None:
    lane = ENGINE.model_copy(update={"engines": [engine]})
    assert (
        rules.engine_shortfalls(TREES.model_copy(update={"engine": lane}), world_size=WORLD) == []
    )


@pytest.mark.parametrize(
    "engine",
    [
        {"cudagraph_mode": "NONE"},
        {"cudagraph_mode": "None", "graphs": ["captured=4"]},
        {"graphs": ["captured=4"]},  # no policy recorded: not known to have had graphs
        {"cudagraph_mode": "FULL", "graphs": ["captured=0"]},
        {"cudagraph_mode": "FULL", "graphs": ("x", "captured=0")},
    ],
)
def test_an_engine_whose_policy_or_count_says_no_graph_is_short(engine: dict[str, object]) -> None:
    lane = ENGINE.model_copy(update={"engines": [{"cudagraph_mode": "FULL"}, engine]})
    [short] = rules.engine_shortfalls(TREES.model_copy(update={"engine": lane}), world_size=WORLD)
    assert short.startswith("an engine ran without CUDA graphs")


def test_a_rank_list_names_the_first_ten() -> None:
    lane = ENGINE.model_copy(update={"ranks": [0]})
    [short] = rules.engine_shortfalls(TREES.model_copy(update={"engine": lane}), world_size=12)
    assert short.startswith("ranks 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 1 more of the 12-rank")
    lane = ENGINE.model_copy(update={"ranks": [0, 1]})
    [short] = rules.engine_shortfalls(TREES.model_copy(update={"engine": lane}), world_size=12)
    assert short.startswith("ranks 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 of the 12-rank")
    lane = ENGINE.model_copy(update={"ranks": list(range(13))})
    [short] = rules.engine_shortfalls(TREES.model_copy(update={"engine": lane}), world_size=2)
    assert short == (
        "engine records of ranks 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and 1 more, not of this run's world"
    )


def test_the_engine_lanes_own_limitations_follow_its_shortfalls() -> None:
    lane = ENGINE.model_copy(
        update={"other_calls": 1, "limitations": [Limitation(key="engine-dcp", text="DCP1")]}
    )
    got = rules.engine_limitations(TREES.model_copy(update={"engine": lane}), world_size=WORLD)
    assert got == {
        "engine": "1 DCP calls took another path than b12x (a fallback)",
        "engine-dcp": "DCP1",
    }
    assert rules.engine_limitations(TREES, world_size=WORLD) == {}


def test_the_hash_seed_limitation_names_each_nodes_drawn_seed_and_not_a_given_one() -> None:
    def seed(node: int, value: int, ranks: list[int], drawn: bool = True) -> HashSeed:
        return HashSeed(node=node, seed=value, drawn=drawn, ranks=ranks)

    assert said("hash-seed", hash_seeds=[seed(0, 17, [0, 1, 2])]) == (
        "the 3 ranks of node 0 started with one string-hash seed (17), drawn by the launcher, "
        "where ranks torchrun starts itself each draw their own: a divergence between ranks "
        "through the iteration order of sets of strings was not exercised (`dcpqual run "
        "--hash-seed SEED` starts ranks with that seed again)"
    )
    two = said("hash-seed", hash_seeds=[seed(0, 17, [0, 1]), seed(1, 99, [2, 3])])
    assert two.startswith(
        "the ranks of each node started with their node's one string-hash seed (node 0: 17, "
        "node 1: 99), drawn by the launcher"
    )
    assert "hash-seed" not in required(hash_seeds=[seed(0, 17, [0, 1], drawn=False)])
    assert "hash-seed" not in required(hash_seeds=[seed(0, 17, [0]), seed(1, 99, [1])])
    shared = ZygoteState(used=True, forked=2, hash_seed="shared-random")
    assert "hash-seed" not in required(zygote=shared, hash_seeds=[])  # the records' word wins


def test_the_hash_seed_limitation_counts_the_forked_ranks_where_they_share_a_seed() -> None:
    shared = ZygoteState(used=True, forked=3, hash_seed="shared-random")
    assert said("hash-seed", zygote=shared) == (
        "3 rank(s) were forked from one preloaded interpreter and share its random string-hash "
        "seed, where ranks torchrun starts itself each draw their own (PYTHONHASHSEED unset): a "
        "divergence between ranks through the iteration order of sets of strings was not "
        "exercised"
    )
    assert "hash-seed" not in required(zygote=shared.model_copy(update={"used": False}))
    assert "hash-seed" not in required(zygote=shared.model_copy(update={"hash_seed": "fixed"}))

    def marker(node: int, zygote: ZygoteState | None) -> NodeState:
        return NodeState(
            node_rank=node, nnodes=3, rdzv_endpoint="n0:1", state="finished", zygote=zygote
        )

    elsewhere = {"0": marker(0, None), "1": marker(1, shared)}
    assert said("hash-seed", zygote=None, nodes=elsewhere).startswith(
        "3 rank(s) were forked from one preloaded interpreter (node(s) 1) and"
    )  # the rules read the other nodes' markers too
    nodes = {"0": marker(0, None), "1": marker(1, shared), "2": marker(2, shared)}
    both = rules.hash_seed_limitation(shared, nodes)["hash-seed"]
    assert both.startswith(
        "9 rank(s) were forked from their node's preloaded interpreter (node(s) 0, 1, 2) and "
    )
    one = rules.hash_seed_limitation(None, {"0": None, "1": marker(1, shared)})["hash-seed"]
    assert one.startswith("3 rank(s) were forked from one preloaded interpreter (node(s) 1) and")
    # Node 0 speaks through its launch, not its marker; a key that is no node rank is ignored.
    assert rules.hash_seed_limitation(None, {"0": marker(0, shared)}) == {}
    assert rules.node_zygotes(None, {"x": marker(1, shared)}) == {0: None}


GONE = NodeZeroGone(waited_s=3.0, by_node=1)


def test_a_bundle_node_1_wrote_for_a_gone_node_0_says_so_and_reads_node_1s_launch() -> None:
    assert said("node-0", node_zero_gone=GONE) == (
        "node 0 ended without writing the bundle; node 1 wrote it from what the shared folder "
        "held: node 0's own record of its launch is lost, and its ranks' files are only what "
        "they left"
    )
    assert "node-0" not in required()
    assert rules.launch_node(Run()) == 0
    assert rules.launch_node(Run(extra=RunExtra(node_zero_gone=GONE))) == 1
    # The launch is node 1's: its zygote is node 1's, and node 1's marker says the same again.
    shared = ZygoteState(used=True, forked=3, hash_seed="shared-random")
    node1 = NodeState(node_rank=1, nnodes=2, rdzv_endpoint="n0:1", state="finished", zygote=shared)
    markers = {"0": None, "1": node1}
    assert said("hash-seed", zygote=shared, nodes=markers, node_zero_gone=GONE).startswith(
        "3 rank(s) were forked from one preloaded interpreter (node(s) 1) and"
    )
    assert rules.hash_seed_limitation(shared, markers, writer=1)["hash-seed"].startswith(
        "3 rank(s) were forked from one preloaded interpreter (node(s) 1) and"
    )
    assert rules.hash_seed_limitation(shared, markers)["hash-seed"].startswith("6 rank(s)")


def test_only_its_fact_founds_the_node_0_limitation() -> None:
    assert rules.unfounded_limitations(["hash-seed", "node-0"], {}) == ["node-0"]
    assert rules.unfounded_limitations(["node-0"], {"node-0": "text"}) == []
    assert rules.unfounded_limitations(["hash-seed", "smoke"], {}) == []


def test_advisory_limitations_are_for_a_reviewer() -> None:
    assert rules.advisory_limitations(backend="nccl", nvml=False, notes=["a", "b"]) == {
        "gpu-facts": "nvidia-ml-py was not importable: GPU UUIDs and driver not from NVML",
        "junit": "a; b",
    }
    assert rules.advisory_limitations(backend="nccl", nvml=True, notes=[]) == {}
    assert rules.advisory_limitations(backend="gloo", nvml=False, notes=[]) == {}


def test_limitations_render_in_order_and_are_checked_by_key_and_text() -> None:
    rendered = rules.render_limitations({"a": "x", "b": "y"}, {"c": "z"})
    assert [(x.key, x.text) for x in rendered] == [("a", "x"), ("b", "y"), ("c", "z")]
    need = {"a": "x", "b": "y", "c": "z"}
    assert rules.missing_limitations(["a", "c"], need) == ["b"]
    assert rules.misstated_limitations([("a", "x"), ("b", "old"), ("d", "w")], need) == ["b"]
    assert rules.misstated_limitations([("a", "x"), ("b", "y")], need) == []


# -- failure reasons -----------------------------------------------------------------------------


def reasons(**changes: object) -> list[str]:
    facts: dict[str, object] = dict(
        suites={"capture": Tally(passed=3)},
        capture=GRAPHS,
        negative_control=NegativeControl(expected=1, detected=1, lazy_events=1),
        signatures=[],
        ranks=Ranks(expected=WORLD, reported=WORLD, complete=WORLD),
        run=Run(),
        coverage=Coverage(collected=4),
    )
    return rules.failure_reasons(**(facts | changes))  # type: ignore[arg-type]


def test_a_clean_run_fails_for_nothing() -> None:
    assert reasons() == []


def test_each_failure_is_told_in_its_own_words() -> None:
    interrupted = Interruption(signal="SIGINT", at="t", after_s=2.0, exit_code=130)
    launch = Launch(interrupted=interrupted)
    assert reasons(run=Run(extra=RunExtra(launch=launch))) == [interrupted.message()]
    assert reasons(run=Run(timed_out=True)) == ["the run timed out and was killed"]
    assert reasons(run=Run(exit_code=3)) == ["torchrun exited with code 3"]
    killed = Ranks(expected=WORLD, reported=3, complete=3, killed=[2])
    assert reasons(ranks=killed) == ["ranks [2] did not finish (no complete record)"]
    assert reasons(capture=GRAPHS.model_copy(update={"lazy_events": 2})) == [
        "2 lazy events during capture"
    ]
    missed = NegativeControl(expected=3, detected=1, lazy_events=1, missed=["a", "b"])
    assert reasons(negative_control=missed) == ["2 of 3 negative-control windows went undetected"]
    assert reasons(negative_control=NegativeControl(expected=3, detected=3, lazy_events=3)) == []


def test_a_gone_node_0_fails_the_run_in_its_own_words() -> None:
    assert reasons(run=Run(extra=RunExtra(node_zero_gone=GONE))) == [
        "node 0 is gone: it wrote no receipt within 3s of node 1's torchrun exiting and never "
        "said its own torchrun finished"
    ]


def test_failed_and_erroring_tests_name_their_suites() -> None:
    suites = {
        "b": Tally(passed=1, errors=2),
        "a": Tally(passed=1, failed=1),
        "c": Tally(passed=4),
    }
    assert reasons(suites=suites) == ["1 failed and 2 erroring tests (suites: a, b)"]
    assert reasons(suites={"a": Tally(skipped=1)}) == ["no test passed"]


def test_signatures_used_in_capture_must_be_warmed() -> None:
    def row(used: bool, warmed: bool) -> SignatureRow:
        return SignatureRow(
            model="m",
            total_heads=8,
            query_head_dim=576,
            output_head_dim=512,
            dtype="bfloat16",
            used_in_capture=used,
            warmed=warmed,
        )

    rows = [row(True, False), row(True, True), row(False, False), row(True, False)]
    assert reasons(signatures=rows) == ["2 signatures used in capture but not warmed on every rank"]
    assert reasons(signatures=[row(True, True), row(False, False)]) == []


def test_selected_tests_without_an_outcome_or_a_body_fail_the_run() -> None:
    nothing = Coverage(collected=0)
    assert reasons(coverage=nothing) == [
        "no test was selected on any rank (pytest's exit 5: nothing to prove)"
    ]
    gone = Ranks(expected=WORLD, reported=0, complete=0, killed=[0, 1, 2, 3])
    assert reasons(coverage=nothing, ranks=gone) == [
        "ranks [0, 1, 2, 3] did not finish (no complete record)"
    ]  # no rank finished to say what it selected
    assert reasons(coverage=None) == []
    early = Coverage(collected=4, without_outcome=2, first_without_outcome="rank 1: t::x")
    assert reasons(coverage=early) == [
        "2 collected tests have no outcome, the first rank 1: t::x (the session ended before "
        "they ran)"
    ]
    bodiless = Coverage(collected=4, no_body=1, first_no_body="t::y")
    assert reasons(coverage=bodiless) == [rules.no_body_text(bodiless)]


def test_strays_and_unscrubbable_files_fail_the_run_with_the_first_five_named() -> None:
    strays = [Stray(path=f"s{i}", kind="file", action="removed") for i in range(7)]
    assert reasons(run=Run(extra=RunExtra(strays=strays))) == [
        "the run left 7 entries that are not evidence: s0 (file), s1 (file), s2 (file), "
        "s3 (file), s4 (file) and 2 more"
    ]
    assert reasons(run=Run(extra=RunExtra(strays=strays[:6])))[0].endswith(" and 1 more")
    five = strays[:5]
    assert reasons(run=Run(extra=RunExtra(strays=five))) == [
        "the run left 5 entries that are not evidence: s0 (file), s1 (file), s2 (file), "
        "s3 (file), s4 (file)"
    ]
    removed = [f"r{i}" for i in range(6)]
    assert reasons(run=Run(extra=RunExtra(scrub=Scrub(removed=removed)))) == [
        "6 files that could not be scrubbed of secrets were removed from the evidence: r0, r1, "
        "r2, r3, r4 and 1 more"
    ]
    assert rules.unscrubbable_reason(["r0"]) == (
        "1 file that could not be scrubbed of secrets was removed from the evidence: r0"
    )
    assert rules.unscrubbable_reason(removed[:2]) == (
        "2 files that could not be scrubbed of secrets were removed from the evidence: r0, r1"
    )
    assert rules.unscrubbable_reason(removed[:5]).startswith("5 files that could not be")
    assert rules.unscrubbable_reason(removed[:5]).endswith(": r0, r1, r2, r3, r4")
    assert reasons(run=Run(extra=RunExtra(scrub=Scrub()))) == []


def test_the_reasons_come_in_the_order_a_reader_needs_leftovers_last() -> None:
    interrupted = Interruption(signal="SIGTERM", at="t", after_s=1.0, exit_code=143)
    run = Run(
        exit_code=1,
        timed_out=True,
        extra=RunExtra(
            launch=Launch(leftovers=[9], interrupted=interrupted),
            strays=[Stray(path="s", kind="fifo", action="removed")],
            scrub=Scrub(removed=["r"]),
        ),
    )
    got = reasons(
        run=run,
        coverage=Coverage(collected=0),
        suites={"a": Tally(failed=1)},
        capture=GRAPHS.model_copy(update={"lazy_events": 1}),
        negative_control=NegativeControl(expected=1, detected=0, lazy_events=0, missed=["a"]),
    )
    assert [r.split(" ")[:3] for r in got] == [
        ["the", "run", "was"],
        ["the", "run", "left"],
        ["1", "file", "that"],
        ["the", "run", "timed"],
        ["no", "test", "was"],
        ["torchrun", "exited", "with"],
        ["1", "failed", "and"],
        ["no", "test", "passed"],
        ["1", "lazy", "events"],
        ["1", "of", "1"],
        ["1", "process", "was"],
    ]


def test_leftover_processes_are_named_per_node_the_first_ten_each() -> None:
    one = Run(extra=RunExtra(launch=Launch(leftovers=[7])))
    assert rules.leftover_reason(one) == (
        "1 process was still running after torchrun exited (pids 7) and ended by the launcher: "
        "work the run left behind was never checked"
    )
    assert rules.leftover_reason(Run()) is None
    assert rules.leftover_reason(Run(extra=RunExtra(launch=Launch()))) is None
    many = Run(extra=RunExtra(launch=Launch(leftovers=list(range(12)))))
    assert rules.leftover_reason(many) == (
        "12 processes were still running after torchrun exited (pids 0, 1, 2, 3, 4, 5, 6, 7, 8, "
        "9 and 2 more) and ended by the launcher: work the run left behind was never checked"
    )
    eleven = Run(extra=RunExtra(launch=Launch(leftovers=list(range(11)))))
    assert "8, 9 and 1 more) and" in (rules.leftover_reason(eleven) or "")
    ten = Run(extra=RunExtra(launch=Launch(leftovers=list(range(10)))))
    assert "(pids 0, 1, 2, 3, 4, 5, 6, 7, 8, 9) and" in (rules.leftover_reason(ten) or "")

    def marker(node: int, leftovers: list[int]) -> NodeState:
        return NodeState(
            node_rank=node, nnodes=3, rdzv_endpoint="n", state="finished", leftovers=leftovers
        )

    # Node 0's marker repeats its launch: its leftovers are counted once, from the launch.
    nodes = {"0": marker(0, [5]), "1": None, "2": marker(2, [8, 9])}
    run = Run(extra=RunExtra(launch=Launch(leftovers=[5]), nodes=nodes))
    assert rules.leftover_reason(run) == (
        "3 processes were still running after torchrun exited (pids 5 on node 0; 8, 9 on node "
        "2) and ended by the launcher: work the run left behind was never checked"
    )
    quiet = Run(extra=RunExtra(launch=Launch(), nodes={"1": marker(1, [])}))
    assert rules.leftover_reason(quiet) is None


# -- the run's outcome from its launch and its nodes' markers -------------------------------------


def node(rank: int, exit_code: int | None = 0, **changes: object) -> NodeState:
    values: dict[str, object] = dict(
        node_rank=rank, nnodes=3, rdzv_endpoint="n", state="finished", exit_code=exit_code
    )
    return NodeState.model_validate(values | changes)


def test_a_single_node_run_ends_as_its_launch_says() -> None:
    assert rules.launched_outcome(Launch(exit_code=2, timed_out=True)) == (2, True)
    assert rules.launched_outcome(Launch()) == (0, False)
    assert rules.launched_outcome(Launch(), {}) == (0, False)


def test_every_node_must_say_it_finished_and_the_first_failing_node_names_the_code() -> None:
    ok = {"0": node(0), "1": node(1), "2": node(2)}
    assert rules.launched_outcome(Launch(), ok) == (0, False)
    failing = {"2": node(2, 5), "10": node(10, 7), "1": node(1, 3)}
    assert rules.launched_outcome(Launch(), failing) == (3, False)  # node order, not text order
    assert rules.launched_outcome(Launch(exit_code=4), failing) == (4, False)  # node 0's first
    assert rules.launched_outcome(Launch(), {"1": None}) == (1, False)
    assert rules.launched_outcome(Launch(), {"1": node(1, None)}) == (1, False)
    assert rules.launched_outcome(Launch(), {"1": node(1, state="started")}) == (1, False)
    assert rules.launched_outcome(Launch(exit_code=6), {"1": None}) == (6, False)
    late = {"1": node(1, 0, timed_out=True)}
    assert rules.launched_outcome(Launch(), late) == (0, True)
    silent_then_failing = {"1": None, "2": node(2, 9, timed_out=True)}
    assert rules.launched_outcome(Launch(), silent_then_failing) == (1, True)  # node 2 read too
    assert rules.launched_outcome(Launch(), {"x": node(2, 9), "1": node(1, 8)}) == (9, False)


# -- every failure of the facts, the engine lane's among them -------------------------------------


@dataclass
class Facts:
    """The fields `failure_reasons_of` reads, as a receipt has them."""

    suites: dict[str, Tally] = field(default_factory=lambda: {"capture": Tally(passed=1)})
    capture: Capture = GRAPHS
    negative_control: NegativeControl = field(
        default_factory=lambda: NegativeControl(expected=1, detected=1, lazy_events=1)
    )
    signatures: list[SignatureRow] = field(default_factory=list)
    ranks: Ranks = field(default_factory=lambda: Ranks(expected=2, reported=2, complete=2))
    run: Run = field(default_factory=Run)
    coverage: Coverage | None = None
    models: Models = field(default_factory=Models)


def test_the_engine_lanes_failures_come_before_the_leftovers() -> None:
    lane = ENGINE.model_copy(update={"lazy_events": 2, "tokens_agree": False})
    run = Run(exit_code=1, extra=RunExtra(launch=Launch(exit_code=1, leftovers=[4])))
    facts = Facts(run=run, models=Models(engine=lane), coverage=Coverage(collected=0))
    assert rules.failure_reasons_of(facts) == [
        "no test was selected on any rank (pytest's exit 5: nothing to prove)",
        "torchrun exited with code 1",
        "2 lazy events inside vLLM's own capture or decode steps",
        "the engine lane's generated tokens differ across ranks (or none recorded)",
        rules.leftover_reason(run),
    ]
    assert rules.failure_reasons_of(Facts()) == []
    no_leftover = Facts(run=Run(exit_code=2), models=Models(engine=lane))
    assert rules.failure_reasons_of(no_leftover)[0] == "torchrun exited with code 2"
    assert rules.failure_reasons_of(no_leftover)[-1].startswith("the engine lane's generated")


def test_the_engine_lanes_failures_in_their_own_words() -> None:
    lane = ENGINE.model_copy(
        update={
            "lazy_events": 1,
            "controls": 5,
            "controls_caught": 2,
            "controls_false": 1,
            "tokens_agree": False,
            "eager_equal": False,
        }
    )
    assert rules.engine_failures(Models(engine=lane)) == [
        "1 lazy events inside vLLM's own capture or decode steps",
        "3 of 5 engine-lane negative controls went undetected",
        "1 engine-lane controls before capture were called lazy",
        "the engine lane's generated tokens differ across ranks (or none recorded)",
        "the engine lane's tokens differ from its enforce_eager engine's (or none)",
    ]
    assert rules.engine_failures(Models(engine=ENGINE)) == []
    over = ENGINE.model_copy(update={"controls_caught": 3})  # more caught than run: no failure
    assert rules.engine_failures(Models(engine=over)) == []
