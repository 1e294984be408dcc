"""The policy: when a run passes, which status word it earns, and what it must admit.

One place for these rules, used by the writer to fill the receipt and by `dcpqual verify` to
check that a receipt's verdict, status and limitations follow from its own facts.

- Verdict `pass` needs: torchrun exit 0, no timeout, every rank complete, at least one test
  selected and every selected test with an outcome on every rank (a session that ended early
  proved less than it selected), no failed or erroring test, at least one passed test, no lazy
  event outside negative controls, every negative-control
  window detected, no signature used in capture without being warmed on every rank, nothing
  left in the out folder that is not evidence (strays), no process left running after
  torchrun exited (leftovers), and, in a multi-node run, a node 0 that wrote the bundle itself
  (one node 1 wrote because node 0 was gone, `run.extra.node_zero_gone`, always fails).
- Status: `not-qualified` for a failing run; `qualified` only for a passing run on a host with
  GPUs that need not admit any limitation of `DENIES_QUALIFIED`: it ran on NCCL, every capture
  window was a real CUDA graph, inside an image identified by its digest whose build tree was
  clean and whose in-image identity check passed, selecting the whole suites/ folder, with the
  b12x transport and a negative control run, every detector watching every capture window,
  from a clean harness checkout, every rank finished and left its JUnit report, no test
  skipped on any rank, and not the one-GPU smoke;
  `source-qualified` for any other passing run (a CPU run, a GPU run outside a locked image, or
  one short of any of these).
- The run's exit code and timeout follow from the launcher's record of its torchrun and, in a
  multi-node run, every node's marker (`launched_outcome`).
- Limitations are `{key, text}` values, written as "<key>: <text>" lines too; the keys of
  `required_limitations` are the ones verify insists on: each follows from facts verify holds
  to the bundle's records (the real trees the ranks built, the warm code, the geometry, ...).
  A few (`FACT_ONLY`) follow from one fact alone, and verify refuses them without it too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple, Protocol

from harness.core.choices import VLLM_WARM_IMPL
from harness.schema.base import Limitation
from harness.schema.image import Image
from harness.schema.launch import Interruption, Launch, NodeState, ZygoteState
from harness.schema.receipt import (
    Capture,
    Coverage,
    Environment,
    Geometry,
    HashSeed,
    Models,
    NegativeControl,
    NodeZeroGone,
    Ranks,
    Run,
    Selection,
    SignatureRow,
    Source,
    Status,
    Tally,
    Verdict,
)

GPU_PATH = "cuda-graph"

# Required limitations that keep a passing run from `qualified`: each says that a path the
# qualification stands for did not run, or that the receipt does not identify what ran.
# `multi-node` is not one of them (a single node is a geometry, not a gap), nor `hash-seed`.
SMOKE_LIMITATION: Final = (
    "a one-GPU smoke of the GPU paths (CUDA-graph capture window, GPU detectors, NCCL group "
    "creation), not a qualification; geometry tp=1/dcp=1 is its single rank"
)
DENIES_QUALIFIED: Final = frozenset(
    {
        "selection",
        "gpu-capture",
        "detectors",
        "nccl",
        "b12x-transport",
        "image",
        "negative-control",
        "ranks",
        "sources",
        "skipped",
        "smoke",
        "engine",
        "test-bodies",
        "node-0",
    }
)
# Limitations only a fact of the run can give: a receipt that names one without that fact
# claims an ending that did not happen (a run that did not need it is not limited so).
NODE_ZERO_KEY: Final = "node-0"
FACT_ONLY: Final = {NODE_ZERO_KEY: "run.extra.node_zero_gone"}


class FailureFacts(Protocol):
    """What the failure rules read: a receipt has these fields, and so do the rank facts the
    writer and verify derive from the records."""

    @property
    def suites(self) -> dict[str, Tally]: ...
    @property
    def capture(self) -> Capture: ...
    @property
    def negative_control(self) -> NegativeControl: ...
    @property
    def signatures(self) -> list[SignatureRow]: ...
    @property
    def ranks(self) -> Ranks: ...
    @property
    def run(self) -> Run: ...
    @property
    def coverage(self) -> Coverage | None: ...
    @property
    def models(self) -> Models: ...


def failure_reasons_of(facts: FailureFacts) -> list[str]:
    """`failure_reasons` of a receipt, or of the facts a receipt is made from."""
    reasons = failure_reasons(
        suites=facts.suites,
        capture=facts.capture,
        negative_control=facts.negative_control,
        signatures=facts.signatures,
        ranks=facts.ranks,
        run=facts.run,
        coverage=facts.coverage,
    )
    leftover = reasons[-1:] if reasons and reasons[-1] == leftover_reason(facts.run) else []
    body = reasons[: len(reasons) - len(leftover)]
    return [*body, *engine_failures(facts.models), *leftover]


def engine_failures(models: Models) -> list[str]:
    """What the engine lane's records show failed, whatever its tests said: something created
    lazily inside vLLM's capture or decode, a negative control missed or misattributed, tokens
    that differ across ranks or from the enforce_eager engine."""
    lane = models.engine
    if lane is None:
        return []
    out = []
    if lane.lazy_events:
        out.append(f"{lane.lazy_events} lazy events inside vLLM's own capture or decode steps")
    if lane.controls_caught < lane.controls:
        out.append(
            f"{lane.controls - lane.controls_caught} of {lane.controls} engine-lane negative "
            "controls went undetected"
        )
    if lane.controls_false:
        out.append(f"{lane.controls_false} engine-lane controls before capture were called lazy")
    if not lane.tokens_agree:
        out.append("the engine lane's generated tokens differ across ranks (or none recorded)")
    if not lane.eager_equal:
        out.append("the engine lane's tokens differ from its enforce_eager engine's (or none)")
    return out


def failure_reasons(
    *,
    suites: dict[str, Tally],
    capture: Capture,
    negative_control: NegativeControl,
    signatures: list[SignatureRow],
    ranks: Ranks,
    run: Run,
    coverage: Coverage | None = None,
) -> list[str]:
    """Every reason the run fails; empty means pass. `coverage` None: not recorded."""
    reasons: list[str] = []
    if run.extra.node_zero_gone is not None:
        reasons.append(node_zero_gone_reason(run.extra.node_zero_gone))
    if run.extra.interrupted is not None:
        reasons.append(run.extra.interrupted.message())
    strays = run.extra.strays
    if strays:
        shown = _first([f"{s.path} ({s.kind})" for s in strays], 5)
        reasons.append(f"the run left {len(strays)} entries that are not evidence: {shown}")
    removed = [] if run.extra.scrub is None else run.extra.scrub.removed
    if removed:
        reasons.append(unscrubbable_reason(removed))
    if run.timed_out:
        reasons.append("the run timed out and was killed")
    if coverage is not None and coverage.collected == 0 and ranks.complete:
        reasons.append("no test was selected on any rank (pytest's exit 5: nothing to prove)")
    if run.exit_code != 0:
        reasons.append(f"torchrun exited with code {run.exit_code}")
    if ranks.killed:
        reasons.append(f"ranks {ranks.killed} did not finish (no complete record)")
    if coverage is not None and coverage.without_outcome:
        reasons.append(
            f"{coverage.without_outcome} collected tests have no outcome, the first "
            f"{coverage.first_without_outcome} (the session ended before they ran)"
        )
    if coverage is not None and coverage.no_body:
        reasons.append(no_body_text(coverage))
    failed = sum(t.failed for t in suites.values())
    errors = sum(t.errors for t in suites.values())
    if failed or errors:
        bad = sorted(name for name, t in suites.items() if t.failed or t.errors)
        reasons.append(f"{failed} failed and {errors} erroring tests (suites: {', '.join(bad)})")
    if sum(t.passed for t in suites.values()) == 0:
        reasons.append("no test passed")
    if capture.lazy_events:
        reasons.append(f"{capture.lazy_events} lazy events during capture")
    if negative_control.detected < negative_control.expected:
        missed = negative_control.expected - negative_control.detected
        reasons.append(
            f"{missed} of {negative_control.expected} negative-control windows went undetected"
        )
    unwarmed = [s for s in signatures if s.used_in_capture and not s.warmed]
    if unwarmed:
        reasons.append(f"{len(unwarmed)} signatures used in capture but not warmed on every rank")
    # Last: where anything else failed, that is the root cause, and the leftovers its wake.
    if (leftover := leftover_reason(run)) is not None:
        reasons.append(leftover)
    return reasons


def no_body_text(coverage: Coverage) -> str:
    """Tests whose call phase pytest never ran: setup and teardown passing prove nothing of a
    test, so such a run fails whatever else it shows (a reason and a limitation both)."""
    return (
        f"no test body ran for {coverage.no_body} test(s): pytest skipped their call phase "
        f"(--setup-only, --setup-plan or a hook), the first {coverage.first_no_body}"
    )


def node_zero_gone_reason(gone: NodeZeroGone) -> str:
    """Node 0 never wrote the bundle: its launcher died (SIGKILL, a lost host) with its run.
    Whatever its ranks' files say, the run fails: node 0's own ending never ran."""
    return (
        f"node 0 is gone: it wrote no receipt within {gone.waited_s:g}s of node "
        f"{gone.by_node}'s torchrun exiting and never said its own torchrun finished"
    )


def node_zero_limitation(gone: NodeZeroGone) -> str:
    """The `node-0` limitation's text: what a bundle node 0 did not write lacks."""
    return (
        f"node 0 ended without writing the bundle; node {gone.by_node} wrote it from what the "
        "shared folder held: node 0's own record of its launch is lost, and its ranks' files "
        "are only what they left"
    )


def launch_node(run: Run) -> int:
    """The node whose launcher wrote the bundle, whose launch `run.extra.launch` records:
    node 0, or the node that wrote it when node 0 was gone."""
    gone = run.extra.node_zero_gone
    return 0 if gone is None else gone.by_node


def leftover_reason(run: Run) -> str | None:
    """Processes a launcher ended because they outlived its torchrun (a daemon a test started,
    a rank's orphan), on node 0 (its launch) or another node (its finished marker): whatever
    they did after their test passed, no test checked."""
    by_node: dict[int, list[int]] = {}
    writer = launch_node(run)
    if run.extra.launch is not None and run.extra.launch.leftovers:
        by_node[writer] = run.extra.launch.leftovers
    for marker in (run.extra.nodes or {}).values():
        if marker is not None and marker.node_rank != writer and marker.leftovers:
            by_node[marker.node_rank] = marker.leftovers
    if not by_node:
        return None
    count = sum(len(pids) for pids in by_node.values())
    were = "process was" if count == 1 else "processes were"
    shown = "; ".join(
        _first(pids, 10) + (f" on node {node}" if run.extra.nodes else "")
        for node, pids in sorted(by_node.items())
    )
    return (
        f"{count} {were} still running after torchrun exited (pids {shown}) and ended by the "
        "launcher: work the run left behind was never checked"
    )


class LaunchedOutcome(NamedTuple):
    """How the run's torchrun ended, as the receipt's `run.exit_code` and `run.timed_out`."""

    exit_code: int
    timed_out: bool


def launched_outcome(
    launch: Launch, nodes: Mapping[str, NodeState | None] | None = None
) -> LaunchedOutcome:
    """The run's outcome from node 0's launch and, with several nodes, every node's last marker
    (keyed by node rank): the run failed if any node's torchrun did, a node that never said it
    finished (or not with what its torchrun exited) counts as a failure, and the first failing
    node's code (in node order) is kept."""
    exit_code, timed_out = launch.exit_code, launch.timed_out
    for _, marker in sorted((nodes or {}).items(), key=lambda item: _node_order(item[0])):
        if marker is None or marker.state != "finished" or marker.exit_code is None:
            exit_code = exit_code or 1  # a node that never said how its torchrun ended failed
            continue
        timed_out = timed_out or marker.timed_out
        if marker.exit_code:
            exit_code = exit_code or int(marker.exit_code)
    return LaunchedOutcome(exit_code, timed_out)


def _node_order(key: str) -> tuple[int, str]:
    return (int(key), "") if key.isdigit() else (-1, key)


def unscrubbable_reason(removed: list[str]) -> str:
    """Files removed because they could not be scrubbed of secrets (a full disk) fail the run,
    not merely limit it: a bundle is judged by what it holds, and what a removed file held (a
    record, a report, a log that named the failure) no one can check again, as with a stray."""
    shown = _first(removed, 5)
    files = "1 file that could not be scrubbed of secrets was"
    if len(removed) > 1:
        files = f"{len(removed)} files that could not be scrubbed of secrets were"
    return f"{files} removed from the evidence: {shown}"


def interruption_message(interrupted: Interruption) -> str:
    """How an interrupted run is named: the signal, when, and how far the tests had got."""
    return interrupted.message()


def verdict_of(reasons: list[str]) -> Verdict:
    return "fail" if reasons else "pass"


def image_blockers(image: Image) -> list[str]:
    """Why this image cannot back `qualified` (digest, clean build tree, in-image check)."""
    return image.qualification_blockers()


def gpu_capture_only(capture: Capture) -> bool:
    """True when capture windows ran and every one was a real CUDA graph."""
    return capture.windows > 0 and capture.paths.get(GPU_PATH, 0) == capture.windows


def narrowing(selection: Selection | None) -> list[str]:
    """How the run selected less than the whole suites/ folder; [] when it did not (or the
    records do not say)."""
    if selection is None:
        return []
    out = []
    if selection.partial_targets:
        out.append(
            "pytest targets other than the whole suites/ folder: "
            + _first(selection.partial_targets, 3)
        )
    if selection.deselected:
        out.append(f"{selection.deselected} collected tests deselected (-k, -m or --deselect)")
    if selection.ignored:
        out.append(f"paths left out with --ignore: {', '.join(selection.ignored[:3])}")
    if selection.unreached:
        out.append(
            f"files of the harness's suites/ that gave no test: {_first(selection.unreached, 3)}"
        )
    if selection.outside:
        out.append(
            f"tests collected from outside the harness's suites/: {_first(selection.outside, 3)}"
        )
    if selection.removed:
        out.append(f"{selection.removed} collected tests taken away without being deselected")
    if selection.rules:
        out.append(f"collection rules not the harness's: {'; '.join(selection.rules[:3])}")
    return out


def _first(items: Sequence[object], shown: int) -> str:
    """The first `shown` of `items`, and how many more: a reason stays one readable line."""
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(str(item) for item in items[:shown]) + more


def denying_limitations(required: Mapping[str, str]) -> list[str]:
    """The keys of `required` (a receipt's `required_limitations`) that deny `qualified`."""
    return [key for key in required if key in DENIES_QUALIFIED]


def status_of(verdict: Verdict, environment: Environment, required: Mapping[str, str]) -> Status:
    """`required`: the run's `required_limitations`, the one account of what did not run."""
    if verdict != "pass":
        return "not-qualified"
    if environment.gpus and not denying_limitations(required):
        return "qualified"
    return "source-qualified"


# The suites whose tests run the selected warm code (the vendored copy unless told otherwise)
# on stand-in or real trees; the engine lane runs vLLM's own warm inside its engine instead.
WARM_SUITES: Final = frozenset({"warmup", "capture", "real"})


def warm_code_ran(suites: Mapping[str, Tally] | None, *, smoke: bool = False) -> bool:
    """Whether a test that runs the selected warm code got to run (passed, failed or erred: a
    skip ran nothing). `suites` None: not known, so assumed (a limitation is never dropped for
    want of a fact); the one-GPU smoke warms with it itself."""
    if suites is None or smoke:
        return True
    ran = (t for name, t in suites.items() if name in WARM_SUITES)
    return any(t.passed + t.failed + t.errors for t in ran)


def required_limitations(
    *,
    geometry: Geometry,
    image: Image | None,
    capture: Capture,
    negative_control: NegativeControl,
    transports: list[str],
    ranks: Ranks,
    sources: dict[str, Source],
    selection: Selection | None = None,
    models: Models,
    warm_impl: str,
    zygote: ZygoteState | None = None,
    nodes: Mapping[str, NodeState | None] | None = None,
    hash_seeds: Sequence[HashSeed] | None = None,
    coverage: Coverage | None = None,
    smoke: bool = False,
    suites: Mapping[str, Tally] | None = None,
    node_zero_gone: NodeZeroGone | None = None,
) -> dict[str, str]:
    """{key: text} for every path that did not run; verify checks that each key is listed.
    `models`: vLLM's real trees the ranks built; `warm_impl`: the warm code the ranks ran, which
    limits the run only where a suite that runs it ran (`suites`, per suite; None: assumed);
    `zygote`: how the launch says its ranks started (None: torchrun started each); `nodes`:
    every node's marker in a multi-node run, which says the same of that node; `hash_seeds`:
    the string-hash seeds the ranks started with (None: the records do not say, and the seeds
    follow from `zygote` and `nodes`, as before the launcher fixed one); `coverage`:
    what the records say ran (None: not recorded); `smoke`: the bundle is the one-GPU smoke's;
    `node_zero_gone`: node 0 died and another node wrote the bundle (then `zygote` is that
    node's)."""
    writer = 0 if node_zero_gone is None else node_zero_gone.by_node
    if hash_seeds is None:
        out: dict[str, str] = hash_seed_limitation(zygote, nodes, writer)
    else:
        out = drawn_seed_limitation(hash_seeds)
    if node_zero_gone is not None:
        out[NODE_ZERO_KEY] = node_zero_limitation(node_zero_gone)
    if smoke:
        out["smoke"] = SMOKE_LIMITATION
    if narrowed := narrowing(selection):
        out["selection"] = (
            "the run selected less than the suites hold, so it qualifies only what ran: "
            + "; ".join(narrowed)
        )
    if not gpu_capture_only(capture):
        if capture.windows == 0:
            out["gpu-capture"] = "no capture window ran, so no capture was checked at all"
        else:
            simulated = capture.windows - capture.paths.get(GPU_PATH, 0)
            out["gpu-capture"] = (
                f"GPU CUDA-graph capture did not run for {simulated} of {capture.windows} "
                "capture windows (cpu-simulated); lazy work only a GPU shows (device memory "
                "growth, NCCL communicator init, Triton/b12x JIT) was not observed there"
            )
    if capture.inactive_detectors:
        named = "; ".join(f"{n} ({why})" for n, why in capture.inactive_detectors.items())
        out["detectors"] = f"these detectors did not watch every capture window: {named}"
    if geometry.backend != "nccl":
        out["nccl"] = f"NCCL did not run: the backend was {geometry.backend}"
    if "b12x" not in transports:
        ran = ", ".join(transports) or "none reported"
        out["b12x-transport"] = (
            f"the b12x PCIe transport did not run (transports: {ran}); its pool creation, IPC "
            "handle exchange and kernel compilation were not exercised"
        )
    if image is None:
        out["image"] = (
            "no image: the run used a source checkout; the image build and the in-image "
            "identity check (torch, CUDA, NCCL, component commits and trees) did not run"
        )
    elif blockers := image_blockers(image):
        out["image"] = f"image {image.reference or '(unnamed)'} cannot qualify: " + "; ".join(
            blockers
        )
    if geometry.nnodes == 1:
        out["multi-node"] = "single node: multi-node rendezvous (c10d) was not exercised"
    # The engine lane's lazy-phase controls count among the run's negative controls, but they
    # show the engine watch firing, not the capture windows' detectors.
    engine_controls = 0 if models.engine is None else models.engine.controls
    if negative_control.expected == 0:
        out["negative-control"] = (
            "no negative-control window ran: the lazy-work detectors were not shown to fire"
        )
    elif capture.windows and negative_control.expected <= engine_controls:
        out["negative-control"] = (
            f"no negative-control window ran beside the {capture.windows} capture windows, only "
            f"the engine lane's {engine_controls} controls: the capture windows' detectors were "
            "not shown to fire"
        )
    if ranks.killed or ranks.missing_junit:
        parts = []
        if ranks.killed:
            parts.append(f"ranks {ranks.killed} did not finish, their records are partial or gone")
            if ranks.stopped:
                parts[-1] += f" (ranks {ranks.stopped} say they were stopped by the run's fault)"
        if ranks.missing_junit:
            parts.append(
                f"ranks {ranks.missing_junit} left no readable JUnit report; their cases in "
                "junit/merged.xml were rebuilt from their records"
            )
        out["ranks"] = "; ".join(parts)
    harness = sources.get("dcpqual")
    if harness is None or harness.commit is None:
        out["sources"] = "the harness is not a git checkout: no commit or tree identifies it"
    elif harness.dirty:
        shown = ", ".join(harness.dirty_paths[:3])
        out["sources"] = (
            f"the harness checkout was dirty (e.g. {shown}): commit and tree do not fully "
            "identify the code that ran"
        )
    warm_ran = warm_code_ran(suites, smoke=smoke)
    if warm_impl != VLLM_WARM_IMPL and warm_ran:
        out["warm-impl"] = f"the warm code qualified is the {warm_impl!r} copy, not vLLM's own"
    # Only the engine lane ran vLLM code (its own classes, in its engine): no stand-in tree ran
    # for the real-tree limitations to speak of.
    if models.engine is None or models.real or warm_ran:
        for key, text in real_tree_limitations(models=models, sources=sources).items():
            out[key] = f"{out[key]}; {text}" if key in out else text
    # The smoke runs no engine, so it is excused the lane's absence, never a lane's own facts.
    if not smoke or models.engine is not None:
        out.update(engine_limitations(models, world_size=geometry.world_size))
    out.update(skip_limitation(coverage))
    if coverage is not None and coverage.no_body:
        out["test-bodies"] = no_body_text(coverage)
    return out


def engine_shortfalls(models: Models, *, world_size: int) -> list[str]:
    """Why the engine lane does not back `qualified`: every rank of the run's world (vLLM's TP
    under the external launcher) must have recorded its engine, it must have run vLLM's own
    warm and capture, b12x must have served the decode DCP calls, and no DCP call may have
    taken another path. The lane's other facts are over the ranks that recorded one, so a rank
    without a record would go unjudged; with no engine named, the graph rule would hold
    vacuously. Empty: nothing is short."""
    lane = models.engine
    if lane is None:
        return [
            "the engine lane did not run (--models engine): the installed vLLM's own startup "
            "(its warm, its CUDA-graph capture, its decode steps) was not qualified"
        ]
    out = []
    if missing := sorted(set(range(world_size)) - set(lane.ranks)):
        out.append(
            f"ranks {_first(missing, 10)} of the {world_size}-rank world left no engine record: "
            "what their engines did was not judged"
        )
    if strangers := sorted(set(lane.ranks) - set(range(world_size))):
        out.append(f"engine records of ranks {_first(strangers, 10)}, not of this run's world")
    if not lane.engines:
        out.append("the engine lane names no engine configuration: its graphs are not known")
    if not lane.warm_ran:
        out.append("not every engine rank ran vLLM's own warm (compile_or_warm_up_model)")
    if not lane.capture_ran:
        out.append(
            "not every engine rank ran vLLM's own capture (the model runner's capture_model)"
        )
    if any(_no_graphs(engine) for engine in lane.engines):
        out.append(
            "an engine ran without CUDA graphs (cudagraph_mode NONE, or vLLM counted no "
            "captured graph): its capture_model captured nothing, so replay was not qualified"
        )
    if lane.b12x_calls.get("decode", 0) == 0:
        out.append("the b12x transport served no decode DCP call")
    if lane.other_calls:
        out.append(f"{lane.other_calls} DCP calls took another path than b12x (a fallback)")
    return out


def _no_graphs(engine: Mapping[str, object]) -> bool:
    """An engine whose policy or vLLM's own graph count says it captured no CUDA graph (an
    `--engine-arg` can turn graphs off while capture_model is still entered)."""
    if str(engine.get("cudagraph_mode")).upper() == "NONE":
        return True
    graphs = engine.get("graphs")
    return isinstance(graphs, list | tuple) and "captured=0" in graphs


def engine_limitations(models: Models, *, world_size: int) -> dict[str, str]:
    """The engine lane's required limitations: `engine` (denies `qualified`) with every
    shortfall, and what the lane's records say of themselves (their keys, e.g. engine-dcp)."""
    out: dict[str, str] = {}
    if shortfalls := engine_shortfalls(models, world_size=world_size):
        out["engine"] = "; ".join(shortfalls)
    if models.engine is not None:
        for item in models.engine.limitations:
            out[item.key] = item.text
    return out


def real_tree_limitations(*, models: Models, sources: Mapping[str, Source]) -> dict[str, str]:
    """What the run did not build of vLLM's real trees: with none built, that only stand-ins
    ran and why (vLLM absent, or installed and not asked for a tree: `sources` says which);
    otherwise that their layers' forward did not run, and what each tree built says of itself
    (its classes, the shims it ran under, what it left out)."""
    if not models.real:
        vllm = sources.get("vllm")
        if vllm is None:
            why = "vLLM is not installed, so no real vLLM tree was built"
        else:
            version = f"vLLM {vllm.version}" if vllm.version else "vLLM"
            why = (
                f"{version} is installed but the run built none of its trees (--models "
                "stand-in, or no selected test built one)"
            )
        return {"real-trees": f"{why}: only stand-in model classes ran, not vLLM's own"}
    said: dict[str, list[str]] = {
        "real-decode": [
            "on the real trees the decode step calls each layer's own dcp_manager.query_gather "
            "and combine (routed through the transport registry: vLLM's combines are "
            "Triton-only) with queries shaped as MLADCPManager was built; the layers' forward "
            "(paged KV cache, forward_mqa, W_UK/W_UV) did not run"
        ]
    }
    for tree in models.trees:  # what several trees say alike is said once
        for item in tree.limitations:
            texts = said.setdefault(item.key, [])
            if item.text not in texts:
                texts.append(item.text)
    return {key: "; ".join(texts) for key, texts in said.items()}


def skip_limitation(coverage: Coverage | None) -> dict[str, str]:
    """{key: text} where tests skipped: a test skipped on every rank proved nothing, and one
    that ran on some ranks only was agreed on without the others (a cross-rank check it holds
    was not made there); neither fails a run, so the receipt must say so."""
    if coverage is None or not (coverage.skipped_everywhere or coverage.skipped_on_some_ranks):
        return {}
    parts = []
    if coverage.skipped_everywhere:
        parts.append(
            f"{coverage.skipped_everywhere} test(s) skipped on every rank, so they proved "
            f"nothing (the first: {coverage.first_skipped_everywhere})"
        )
    if coverage.skipped_on_some_ranks:
        parts.append(
            f"{coverage.skipped_on_some_ranks} test(s) skipped on some ranks and ran on others "
            f"(the first: {coverage.first_skipped_on_some_ranks})"
        )
    return {"skipped": "; ".join(parts)}


def node_zygotes(
    zygote: ZygoteState | None,
    nodes: Mapping[str, NodeState | None] | None,
    writer: int = 0,
) -> dict[int, ZygoteState | None]:
    """{node rank: its zygote's state} as far as the receipt knows: the writing node's (node 0,
    or `writer` when node 0 was gone) from its launch, every other node's from its marker
    (None: no zygote, or a marker that does not say; a node 0 that is gone said nothing)."""
    known: dict[int, ZygoteState | None] = {writer: zygote}
    for key, marker in (nodes or {}).items():
        if marker is not None and marker.node_rank != writer and key.isdigit():
            known[marker.node_rank] = marker.zygote
    return known


def hash_seed_limitation(
    zygote: ZygoteState | None,
    nodes: Mapping[str, NodeState | None] | None = None,
    writer: int = 0,
) -> dict[str, str]:
    """{key: text} where ranks were forked from a zygote and share its random string-hash seed,
    where ranks torchrun starts itself would each draw their own: on any node whose state the
    receipt holds (node 0's launch, the other nodes' markers)."""
    shared = {
        k: z
        for k, z in sorted(node_zygotes(zygote, nodes, writer).items())
        if z is not None and z.used and z.hash_seed == "shared-random"
    }
    if not shared:
        return {}
    forked = sum(z.forked for z in shared.values())
    where = (
        "one preloaded interpreter" if len(shared) == 1 else "their node's preloaded interpreter"
    )
    if nodes:
        where += f" (node(s) {', '.join(str(k) for k in shared)})"
    return {
        "hash-seed": (
            f"{forked} rank(s) were forked from {where} and share its "
            "random string-hash seed, where ranks torchrun starts itself each draw their own "
            "(PYTHONHASHSEED unset): a divergence between ranks through the iteration order of "
            "sets of strings was not exercised"
        )
    }


def drawn_seed_limitation(hash_seeds: Sequence[HashSeed]) -> dict[str, str]:
    """{key: text} where ranks of one node share a string-hash seed the launcher drew, where
    ranks torchrun starts itself would each draw their own (a seed the user gave is theirs to
    share: torchrun's ranks would share it too)."""
    shared = [s for s in hash_seeds if s.drawn and len(s.ranks) > 1]
    if not shared:
        return {}
    if len(shared) == 1:
        (one,) = shared
        who = f"the {len(one.ranks)} ranks of node {one.node} started with one string-hash seed"
        seeds = f"{one.seed}"
    else:
        who = "the ranks of each node started with their node's one string-hash seed"
        seeds = ", ".join(f"node {s.node}: {s.seed}" for s in shared)
    return {
        "hash-seed": (
            f"{who} ({seeds}), drawn by the launcher, where ranks torchrun starts itself each "
            "draw their own: a divergence between ranks through the iteration order of sets "
            "of strings was not exercised (`dcpqual run --hash-seed SEED` starts ranks with "
            "that seed again)"
        )
    }


def advisory_limitations(*, backend: str, nvml: bool, notes: list[str]) -> dict[str, str]:
    """{key: text} worth a reviewer's attention that verify does not insist on."""
    out: dict[str, str] = {}
    if backend == "nccl" and not nvml:
        out["gpu-facts"] = "nvidia-ml-py was not importable: GPU UUIDs and driver not from NVML"
    if notes:
        out["junit"] = "; ".join(notes)
    return out


def render_limitations(*parts: dict[str, str]) -> list[Limitation]:
    return [Limitation(key=key, text=text) for part in parts for key, text in part.items()]


def missing_limitations(keys: list[str], required: dict[str, str]) -> list[str]:
    """Required keys that no limitation has."""
    return [key for key in required if key not in keys]


def unfounded_limitations(keys: list[str], required: Mapping[str, str]) -> list[str]:
    """Limitation keys only a fact can give (`FACT_ONLY`, key -> the fact) that the receipt
    names without that fact."""
    return [key for key in keys if key in FACT_ONLY and key not in required]


def repeated_limitations(keys: list[str]) -> list[str]:
    """Keys that more than one limitation has, in order: the writer names each once, and a
    second text under a key the rules give (a reader that maps keys to texts keeps one of
    them) could say what the rules do not."""
    return sorted({key for key in keys if keys.count(key) > 1}, key=keys.index)


def misstated_limitations(stated: list[tuple[str, str]], required: dict[str, str]) -> list[str]:
    """Required keys that limitations name, none of them with the text the rules give (a pure
    function of the receipt): a limitation kept by its key but emptied of what it says."""
    keys = {key for key, _ in stated}
    return [k for k, text in required.items() if k in keys and (k, text) not in stated]
