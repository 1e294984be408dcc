"""The policy: when a run passes, which status word it earns, and what it must admit.

One place for these rules, used by the writer to fill the receipt and by `dcpqual verify` to
check that a receipt's verdict, status and limitations follow from its own facts.

- Verdict `pass` needs: torchrun exit 0, no timeout, every rank complete, at least one test
  selected and every selected test with an outcome on every rank (a session that ended early
  proved less than it selected), no failed or erroring test, at least one passed test, no lazy
  event outside negative controls, every negative-control
  window detected, and no signature used in capture without being warmed on every rank.
- Status: `not-qualified` for a failing run; `qualified` only for a passing run on NCCL, on a
  host with GPUs, whose every capture window was a real CUDA graph, inside an image identified
  by its digest whose build tree was clean and whose in-image identity check passed;
  `source-qualified` for any other passing run (a CPU run, or a GPU run outside a locked image).
- Limitations are `{key, text}` values, written as "<key>: <text>" lines too; the keys of
  `required_limitations` are the ones verify insists on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from harness.schema.base import Limitation
from harness.schema.image import Image
from harness.schema.launch import Interruption, NodeState, ZygoteState
from harness.schema.receipt import (
    Capture,
    Coverage,
    Environment,
    Geometry,
    NegativeControl,
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


def failure_reasons_of(facts: FailureFacts) -> list[str]:
    """`failure_reasons` of a receipt, or of the facts a receipt is made from."""
    return failure_reasons(
        suites=facts.suites,
        capture=facts.capture,
        negative_control=facts.negative_control,
        signatures=facts.signatures,
        ranks=facts.ranks,
        run=facts.run,
        coverage=facts.coverage,
    )


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
    if run.extra.interrupted is not None:
        reasons.append(run.extra.interrupted.message())
    strays = run.extra.strays
    if strays:
        shown = ", ".join(f"{s.path} ({s.kind})" for s in strays[:5])
        more = f" and {len(strays) - 5} more" if len(strays) > 5 else ""
        reasons.append(f"the run left {len(strays)} entries that are not evidence: {shown}{more}")
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
    return reasons


def unscrubbable_reason(removed: list[str]) -> str:
    """Files removed because they could not be scrubbed of secrets (a full disk) fail the run,
    not merely limit it: a bundle is judged by what it holds, and what a removed file held (a
    record, a report, a log that named the failure) no one can check again, as with a stray."""
    shown = ", ".join(removed[:5]) + (f" and {len(removed) - 5} more" if len(removed) > 5 else "")
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
        shown = ", ".join(selection.partial_targets[:3])
        more = (
            f" and {len(selection.partial_targets) - 3} more"
            if len(selection.partial_targets) > 3
            else ""
        )
        out.append(f"pytest targets other than the whole suites/ folder: {shown}{more}")
    if selection.deselected:
        out.append(f"{selection.deselected} collected tests deselected (-k, -m or --deselect)")
    if selection.ignored:
        out.append(f"paths left out with --ignore: {', '.join(selection.ignored[:3])}")
    return out


def status_of(
    verdict: Verdict,
    geometry: Geometry,
    image: Image | None,
    capture: Capture,
    environment: Environment,
    selection: Selection | None = None,
) -> Status:
    """`selection` None: the records do not say what was selected."""
    if verdict != "pass":
        return "not-qualified"
    locked = image is not None and not image_blockers(image)
    on_gpus = bool(environment.gpus)
    whole = not narrowing(selection)
    if geometry.backend == "nccl" and locked and on_gpus and gpu_capture_only(capture) and whole:
        return "qualified"
    return "source-qualified"


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
    zygote: ZygoteState | None = None,
    nodes: Mapping[str, NodeState | None] | None = None,
) -> dict[str, str]:
    """{key: text} for every path that did not run; verify checks that each key is listed.
    `zygote`: how the launch says its ranks started (None: torchrun started each); `nodes`:
    every node's marker in a multi-node run, which says the same of that node."""
    out: dict[str, str] = hash_seed_limitation(zygote, nodes)
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
    if negative_control.expected == 0:
        out["negative-control"] = (
            "no negative-control window ran: the lazy-work detectors were not shown to fire"
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
    return out


def node_zygotes(
    zygote: ZygoteState | None, nodes: Mapping[str, NodeState | None] | None
) -> dict[int, ZygoteState | None]:
    """{node rank: its zygote's state} as far as the receipt knows: node 0's from its launch,
    every other node's from its marker (None: no zygote, or a marker that does not say)."""
    known: dict[int, ZygoteState | None] = {0: zygote}
    for key, marker in (nodes or {}).items():
        if marker is not None and marker.node_rank != 0 and key.isdigit():
            known[marker.node_rank] = marker.zygote
    return known


def hash_seed_limitation(
    zygote: ZygoteState | None, nodes: Mapping[str, NodeState | None] | None = None
) -> dict[str, str]:
    """{key: text} where ranks were forked from a zygote and share its random string-hash seed,
    where ranks torchrun starts itself would each draw their own: on any node whose state the
    receipt holds (node 0's launch, the other nodes' markers)."""
    shared = {
        k: z
        for k, z in sorted(node_zygotes(zygote, nodes).items())
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


def advisory_limitations(
    *, sources: dict[str, Source], warm_impl: str, backend: str, nvml: bool, notes: list[str]
) -> dict[str, str]:
    """{key: text} worth a reviewer's attention that verify does not insist on."""
    out: dict[str, str] = {}
    if "vllm" not in sources:
        out["vllm"] = "vLLM is not installed: stand-in model classes were used, not vLLM's own"
    if warm_impl != "vllm":
        out["warm-impl"] = f"the warm code qualified is the {warm_impl!r} copy, not vLLM's own"
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


def misstated_limitations(stated: list[tuple[str, str]], required: dict[str, str]) -> list[str]:
    """Required keys that limitations name, none of them with the text the rules give (a pure
    function of the receipt): a limitation kept by its key but emptied of what it says."""
    keys = {key for key, _ in stated}
    return [k for k, text in required.items() if k in keys and (k, text) not in stated]
