"""Negative controls: lazy work done on purpose inside a window must be reported, on every rank.

- The seed control is the bug the seed change fixed: warm Kimi-K3 with the recognizer set from
  before the change ("before-kimi", whatever `--warm-impl` the run qualifies), and its transport
  is created lazily inside capture. Strict mode must stop at it with an error naming the
  signature (6 x dcp heads, 576 -> 512; 96 heads at TP16/DCP16); record mode must see the
  creation through the registry and buffer detectors, and see nothing once those two are
  removed, although the registry counts the creation.
- One control per detector (`harness.capture.controls`), in record mode: the detector reports
  it; with that one detector removed, no detector reports anything although the control's own
  counter shows the work was done. A detector that cannot run on this machine is skipped with
  its reason (also listed as a limitation in every capture record). The dynamo controls run
  once, in a child process of rank 0 (`harness.capture.offrank`: no rank imports dynamo);
  rank 0 records their window and their verdict is every rank's.

- Warm-code mistakes (`harness.capture.broken_warms.WARM_CODE_MISTAKES`), each caught on the
  contrast tree exactly as `harness.capture.contrasts.CAUGHT_AS` says, naming its key: a key
  the layers use missed (the strict window's first event), a key the DCP group refuses at
  creation, or a key warmed that no layer uses.
- Broken warms (`harness.capture.broken_warms`), each caught: a warm that runs only the gather
  (the reduction's first use inside capture, at the run's geometry); at the held-out geometry
  (DCP group a proper subgroup, tp != dcp), a warm reading Kimi-K3's local heads as
  num_heads // dcp (its real transport missed inside capture) and one ignoring its DCP group
  (refused at creation, on every rank).

These tests pass under every `--warm-impl`, and run before the capture checks (see this
suite's conftest), so a run that qualifies a broken warmup still shows every detector firing.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.capture.broken_warms import BROKEN_WARMS, WARM_CODE_MISTAKES
from harness.capture.check import DETECTOR_NAMES, capture_record, default_detectors
from harness.capture.contrasts import CAUGHT_AS, describe
from harness.capture.detector import without
from harness.capture.events import LazySpecializationError
from harness.capture.offrank import OFF_RANK, VARIANTS, ControlOutcome, run_control
from harness.capture.window import CaptureWindow
from harness.core.capacity import RuntimeCapacity
from harness.core.signature import TransportSignature
from harness.errors import GeometryError, QualificationError
from harness.models.builders import CONTRASTS
from harness.transport.registry import TransportRegistry

SEED_DETECTORS = ("transport-registry", "transport-buffers")
BROKEN = "harness.capture.broken_warms:"
assert set(BROKEN_WARMS) == {"gather-only", "local-heads-by-dcp", "ignores-dcp-group"} | set(
    WARM_CODE_MISTAKES
)
assert set(WARM_CODE_MISTAKES) == set(CAUGHT_AS)
KIMI_HEADS, KIMI_QDIM, KIMI_ODIM = 96, 576, 512


def kimi_signature(qualification, context) -> TransportSignature:
    """The transport the seed change warms: Kimi-K3's local heads x dcp, 576 -> 512, at the
    runtime's token capacity. Local heads are ceil(heads / tp): the fork pads the tail (TP9:
    11 per rank, 99 gathered)."""
    local = -(-KIMI_HEADS // qualification.tp)
    return TransportSignature(
        dtype=context.dtype,
        total_heads=local * qualification.dcp,
        query_head_dim=KIMI_QDIM,
        output_head_dim=KIMI_ODIM,
        dcp_world_size=qualification.dcp,
        max_tokens=RuntimeCapacity.from_env().tokens(context.max_tokens),
        device_type=context.device_type,
    )


def _record(record_capture, request, world, window, *, model, warm_impl, path, expected):
    record_capture(
        capture_record(
            test=request.node.nodeid,
            model=model,
            rank=world.rank,
            path=path,
            warm_impl=warm_impl,
            events=window.events,
            statuses=window.statuses,
            negative_control=True,
            expected_detectors=expected,
        )
    )


def _path(world) -> str:
    return "cuda-graph" if world.device.type == "cuda" else "cpu-simulated"


def test_seed_control_strict_names_the_signature(
    world, qualification, prepare, agree, record_capture, request
):
    prepared = prepare("kimi-k3", "before-kimi")
    expected = kimi_signature(qualification, prepared.context)
    window = CaptureWindow(prepared.detectors(), registry=prepared.registry, mode="strict")
    error: LazySpecializationError | None = None
    try:
        window.capture(prepared.step, prepared.step.make_inputs(seed=20))
    except LazySpecializationError as exc:
        error = exc
    _record(
        record_capture,
        request,
        world,
        window,
        model="kimi-k3",
        warm_impl=prepared.warm_impl,
        path=_path(world),
        expected=("transport-registry",),
    )
    message = str(error)
    ok = (
        error is not None
        and len(window.events) == 1
        and error.event.detector == "transport-registry"
        and error.event.signature == expected
        and f"{expected.total_heads} heads x {KIMI_QDIM} -> {KIMI_ODIM}" in message
        and expected not in prepared.report.signatures
    )
    agree(ok, f"strict window names the lazily created Kimi transport (got: {message})")


def test_seed_control_record(world, qualification, prepare, agree_all, record_capture, request):
    """Two record windows over the same lazy creation, each on its own freshly warmed model:
    with every detector it is seen; with the seed detectors removed it goes unseen."""

    def window_over_the_creation(removed: bool) -> tuple[Any, CaptureWindow, int, str]:
        prepared = prepare("kimi-k3", "before-kimi")
        detectors = prepared.detectors()
        if removed:
            detectors = without(detectors, *SEED_DETECTORS)
        window = CaptureWindow(detectors, registry=prepared.registry, mode="record")
        before = prepared.registry.counters.creations
        captured = window.capture(prepared.step, prepared.step.make_inputs(seed=21))
        created = prepared.registry.counters.creations - before
        return prepared, window, created, captured.path

    prepared, window, created, path = window_over_the_creation(removed=False)
    expected = kimi_signature(qualification, prepared.context)
    _record(
        record_capture,
        request,
        world,
        window,
        model="kimi-k3",
        warm_impl=prepared.warm_impl,
        path=path,
        expected=SEED_DETECTORS,
    )
    seen = {e.detector for e in window.events}
    lazily_created = [e.signature for e in window.events if e.what.startswith("transport created")]
    # The registry's account of one lazy creation, in order, each about the Kimi transport.
    registry_said = [
        (e.what.split(":")[0].split(" (")[0], e.signature)
        for e in window.events
        if e.detector == "transport-registry"
    ]
    registry_expected = [
        (what, expected)
        for what in (
            "registry miss in get",
            "registry miss in get_or_create",
            "transport created lazily inside capture",
            "first use of gather with bfloat16 inside capture",
            "first use of reduce with bfloat16 inside capture",
        )
    ]
    _, unseen_window, unseen_created, _ = window_over_the_creation(removed=True)
    agree_all(
        (
            created == 1
            and seen == set(SEED_DETECTORS)
            and lazily_created == [expected]
            and registry_said == registry_expected,
            f"record window sees the Kimi transport created lazily, its detectors alone and the "
            f"registry's five events in order ({seen=}, {created=}, {registry_said=})",
        ),
        (
            unseen_created == 1 and not unseen_window.events,
            f"with {SEED_DETECTORS} removed the lazy creation goes unseen "
            f"(created={unseen_created})",
        ),
    )


@pytest.mark.parametrize("detector", DETECTOR_NAMES)
def test_detector_control(detector, world, agree_all, record_capture, request, off_rank):
    """Both windows of one detector's control: with every detector it reports the control;
    with that one detector removed the control's work is done and nothing reports it."""
    with TransportRegistry("torch", device=world.device) as registry:
        status = next(
            d.status()
            for d in default_detectors(registry, device=world.device)
            if d.name == detector
        )
    if not status.active:
        pytest.skip(f"{detector} cannot run here: {status.reason}")
    outcomes: dict[str, ControlOutcome] = {}
    if detector in OFF_RANK:
        try:
            outcomes = {v: o for v in VARIANTS if (o := off_rank(detector, v)) is not None}
        except QualificationError as exc:  # no verdict from the child: every rank fails
            agree_all((False, f"{detector} control, run off the ranks: {exc}"))
            return
        if not outcomes:  # the lowest rank's child process ran it: its verdict decides
            agree_all((True, f"{detector} control, run once off the ranks by rank 0"))
            return
    else:
        outcomes = {
            variant: run_control(
                detector,
                removed=variant == "detector-removed",
                device=world.device,
                rank=world.rank,
                world_size=world.size,
            )
            for variant in VARIANTS
        }
    detected, removed = outcomes["detected"], outcomes["detector-removed"]
    record_capture(
        capture_record(
            test=request.node.nodeid,
            model="none",
            rank=world.rank,
            path=detected.path,
            warm_impl="none",
            events=detected.events,
            statuses=detected.statuses,
            negative_control=True,
            expected_detectors=(detector,),
        )
    )
    seen, unseen = list(detected.seen), list(removed.seen)
    agree_all(
        (detected.done > 0 and seen == [detector], f"{detector} reports its control ({seen=})"),
        (
            removed.done > 0 and not unseen,
            f"{detector} removed: its control goes unseen (seen={unseen})",
        ),
    )


def _strict_capture(prepared, seed: int) -> tuple[CaptureWindow, LazySpecializationError | None]:
    window = CaptureWindow(prepared.detectors(), registry=prepared.registry, mode="strict")
    try:
        window.capture(prepared.step, prepared.step.make_inputs(seed=seed))
    except LazySpecializationError as exc:
        return window, exc
    return window, None


def test_gather_only_warm_is_caught_at_the_first_reduction(
    world, qualification, prepare, agree, record_capture, request
):
    """Every transport exists before capture, but its reduction never ran: strict mode stops
    at the reduction's first use, naming the Kimi signature."""
    prepared = prepare("kimi-k3", BROKEN + "warm_gather_only")
    expected = kimi_signature(qualification, prepared.context)
    window, error = _strict_capture(prepared, 22)
    _record(
        record_capture,
        request,
        world,
        window,
        model="kimi-k3",
        warm_impl=prepared.warm_impl,
        path=_path(world),
        expected=("transport-registry",),
    )
    what = error.event.what if error is not None else "nothing"
    ok = (
        error is not None
        and len(window.events) == 1
        and error.event.detector == "transport-registry"
        and error.event.signature == expected
        and what.startswith("first use of reduce with bfloat16 inside capture")
        and expected in prepared.report.signatures
        and prepared.registry.operations(expected) == (("gather", "bfloat16"),)
    )
    agree(ok, f"gather-only warm caught at the first reduction (got: {what})")


def test_local_heads_by_dcp_warm_is_caught_at_the_held_out_geometry(
    world, held_out, prepare, agree, record_capture, request
):
    prepared = prepare("kimi-k3", BROKEN + "warm_local_heads_by_dcp", held_out)
    expected = kimi_signature(held_out, prepared.context)
    window, error = _strict_capture(prepared, 23)
    _record(
        record_capture,
        request,
        world,
        window,
        model="kimi-k3",
        warm_impl=prepared.warm_impl,
        path=_path(world),
        expected=("transport-registry",),
    )
    what = error.event.what if error is not None else "nothing"
    ok = (
        error is not None
        and len(window.events) == 1
        and error.event.detector == "transport-registry"
        and error.event.signature == expected
        and what.startswith("registry miss")
        and expected not in prepared.report.signatures
    )
    agree(ok, f"num_heads // dcp warm caught at TP{held_out.tp}/DCP{held_out.dcp} (got: {what})")


def test_warm_ignoring_its_dcp_group_is_refused_at_the_held_out_geometry(
    world, held_out, prepare, agree
):
    error: GeometryError | None = None
    try:
        prepare("kimi-k3", BROKEN + "warm_ignoring_dcp_group", held_out)
    except GeometryError as exc:
        error = exc
    ok = error is not None and f"needs a DCP group of {held_out.dcp} ranks" in str(error)
    agree(ok, f"a warm on the world instead of the DCP group is refused (got: {error})")


@pytest.mark.parametrize("mistake", WARM_CODE_MISTAKES)
def test_warm_code_mistake_is_caught_on_the_contrast_tree(
    mistake, world, contrast, contrast_keys_here, prepare, agree, record_capture, request
):
    how, which = CAUGHT_AS[mistake]
    key = contrast_keys_here[which]
    expected = f"expected {how} of [{key.describe()}]"
    try:
        prepared = prepare(CONTRASTS, BROKEN + WARM_CODE_MISTAKES[mistake].__name__, contrast)
    except GeometryError as exc:
        refusal = f"transport [{key.describe()}] needs a DCP group of 1 ranks, get_or_create "
        refusal += f"got a group of {contrast.dcp}"
        agree(how == "refused" and str(exc) == refusal, f"{mistake}: {expected}, got {exc}")
        return
    window, error = _strict_capture(prepared, 24)
    if how == "registry miss":  # a window that must see its lazy work (the others see none)
        _record(
            record_capture,
            request,
            world,
            window,
            model=CONTRASTS,
            warm_impl=prepared.warm_impl,
            path=_path(world),
            expected=("transport-registry",),
        )
    warmed = set(prepared.report.signatures)
    if error is not None:
        got = f"{len(window.events)} event(s), the first: {error.event.what.split(':')[0]} of "
        got += f"[{error.event.signature.describe()}]"
        ok = (
            how == "registry miss"
            and len(window.events) == 1
            and error.event.detector == "transport-registry"
            and error.event.what.startswith("registry miss")
            and error.event.signature == key
            and key not in warmed
        )
    else:
        unused = warmed - set(prepared.step.used_signatures)
        got = f"no lazy event, warmed but used by no layer: {describe(unused)}"
        ok = how == "unused" and unused == {key}
    agree(ok, f"{mistake}: {expected}, got {got}")
