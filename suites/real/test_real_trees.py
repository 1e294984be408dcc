"""Qualify the warm code on vLLM 0.32's own Kimi-K3 tree, watched at vLLM's own call sites.

The oracle (`harness.capture.callsites`) reads what each layer's `MLADCPManager` was built
for and what its `query_gather`/`combine` are handed; it shares nothing with the recognizers.
Negative controls run first (file order in this module), so a run that qualifies a broken
warm implementation still shows the controls firing.
"""

from __future__ import annotations

from harness.capture.check import capture_record, signature_uses
from harness.capture.events import LazySpecializationError

MODEL = "kimi-k3-real"  # its own row in the receipt's signature table


def _record(record_capture, request, world, warmed, window, used, **extra):
    record_capture(
        capture_record(
            test=request.node.nodeid,
            model=MODEL,
            rank=world.rank,
            path="cpu-simulated",
            warm_impl=warmed.warm_impl,
            events=window.events,
            statuses=window.statuses,
            signatures=signature_uses(MODEL, warmed.report.signatures, used),
            **extra,
        )
    )


def test_control_before_kimi_is_caught_on_the_real_tree(
    world, qualification, warm_real, agree, record_capture, request
):
    warmed = warm_real("before-kimi")
    window = warmed.window("record")
    with warmed.router() as router:
        window.capture(warmed.step, warmed.step.make_inputs(seed=30))
    _record(
        record_capture,
        request,
        world,
        warmed,
        window,
        router.served,
        negative_control=True,
        expected_detectors=("transport-registry",),
    )
    lazy = {e.signature.describe() for e in window.events if e.signature is not None}
    total = 96 // world.size * qualification.dcp
    named = f"{total} heads x 576 -> 512"
    ok = not warmed.report.signatures and bool(lazy) and all(s.startswith(named) for s in lazy)
    agree(ok, f"before-kimi on the real tree creates the Kimi transport in capture ({lazy})")


def test_draft_shares_the_forward_context_as_its_own_tree(world, real_kimi, agree):
    tree = real_kimi.tree
    in_target = {id(m) for m in tree.target.modules()}
    draft = [tree.static_forward_context[name] for name in tree.draft_layers]
    ok = bool(draft) and not any(id(m) in in_target for m in draft)
    agree(ok, f"the real MTP draft is a separate tree in the forward context ({tree.draft_layers})")


def _lazy_keys(warmed, seed):
    window = warmed.window("record")
    with warmed.router() as router:
        window.capture(warmed.step, warmed.step.make_inputs(seed=seed))
    lazy = {e.signature for e in window.events if e.detector == "transport-registry"}
    return window, router, lazy


def test_modules_only_warm_against_the_draft(world, warm_real, agree, record_capture, request):
    """A warm that walks only `model.modules()` never sees the draft. Compared with the same
    warm over the forward context too: where the draft's keys equal the target's the dedupe
    makes skipping it harmless (nothing more is lazy); where they differ the draft's keys must
    show up as lazy. The record says which case this geometry was."""
    full = warm_real("vendored")
    sites = full.built.sites
    draft_names = set(full.built.tree.draft_layers)
    draft_calls = {s.call for s in sites if s.name in draft_names}
    differs = not draft_calls <= {s.call for s in sites if s.name not in draft_names}
    _, _, lazy_full = _lazy_keys(full, seed=31)
    modules_only = warm_real("vendored", modules_only=True)
    window, router, lazy_modules = _lazy_keys(modules_only, seed=31)
    _record(
        record_capture,
        request,
        world,
        modules_only,
        window,
        router.served,
        negative_control=differs,
        expected_detectors=("transport-registry",) if differs else (),
    )
    extra = lazy_modules - lazy_full
    case = "draft differs: must be caught" if differs else "draft equals target: dedupe covers"
    agree(bool(extra) == differs, f"modules-only warm ({case}); lazy beyond a full warm: {extra}")


def test_real_capture_has_no_lazy_work(
    world, warm_impl_name, warm_real, agree, record_capture, request
):
    warmed = warm_real(warm_impl_name)
    window = warmed.window("strict")
    with warmed.router() as router:
        try:
            captured = window.capture(warmed.step, warmed.step.make_inputs(seed=32))
        except LazySpecializationError:
            _record(record_capture, request, world, warmed, window, router.served)
            raise
        fresh = warmed.step.make_inputs(seed=33)
        replayed = captured.replay(fresh)
        eager = warmed.step(fresh)
    _record(record_capture, request, world, warmed, window, router.served, replays=captured.replays)
    same = all(a.equal(b) for a, b in zip(replayed, eager, strict=True))
    agree(not window.events, "real Kimi-K3: lazy work inside capture")
    agree(router.served <= set(warmed.report.signatures), "real call sites used warmed keys")
    agree(same, "real Kimi-K3: replay matches eager")
