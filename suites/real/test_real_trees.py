"""Qualify the warm code on vLLM 0.32's own trees, watched at vLLM's own call sites.

The oracle (`harness.capture.callsites`) reads what each layer's `MLADCPManager` was built
for and what its `query_gather`/`combine` are handed; it shares nothing with the recognizers.
Negative controls run first (file order in this module), so a run that qualifies a broken
warm implementation still shows the controls firing.
"""

from __future__ import annotations

import functools

import pytest

from harness.capture.callsites import CallSiteKey, CallSiteRouter, RealDecodeStep, warm_exactly
from harness.capture.check import capture_record, default_detectors, signature_uses
from harness.capture.events import LazySpecializationError
from harness.capture.window import CaptureWindow
from harness.transport.registry import TransportRegistry


@pytest.fixture
def model_row(real_model) -> str:
    """Its own row in the receipt's signature table (`kimi-k3-real`, `deepseek-v3-real`)."""
    return f"{real_model}-real"


@pytest.fixture
def kimi_only(real_model) -> None:
    if real_model != "kimi-k3":
        pytest.skip(f"a Kimi-K3 control; this run's real tree is {real_model}")


@pytest.fixture
def with_draft(real_tree) -> None:
    if real_tree.tree.draft is None:
        pytest.skip(f"{real_tree.tree.spec.model} is built without a draft")


def _record(record_capture, request, world, window, used, *, warm_impl, warmed, **extra):
    """This rank's record of one capture on the real tree: `warmed` are the signatures the warm
    created, `used` the ones the call sites were served."""
    model = request.getfixturevalue("model_row")
    record_capture(
        capture_record(
            test=request.node.nodeid,
            model=model,
            rank=world.rank,
            path="cpu-simulated",
            warm_impl=warm_impl,
            events=window.events,
            statuses=window.statuses,
            signatures=signature_uses(model, warmed, used),
            **extra,
        )
    )


def test_control_before_kimi_is_caught_on_the_real_tree(
    world, qualification, kimi_only, warm_real, agree, record_capture, request
):
    warmed = warm_real("before-kimi")
    window = warmed.window("record")
    with warmed.router() as router:
        window.capture(warmed.step, warmed.step.make_inputs(seed=30))
    _record(
        record_capture,
        request,
        world,
        window,
        router.served,
        warm_impl=warmed.warm_impl,
        warmed=warmed.report.signatures,
        negative_control=True,
        expected_detectors=("transport-registry",),
    )
    lazy = {e.signature.describe() for e in window.events if e.signature is not None}
    total = (
        -(-96 // world.size) * qualification.dcp
    )  # ceil: a padded tail where tp splits 96 unevenly
    named = f"{total} heads x 576 -> 512"
    ok = not warmed.report.signatures and bool(lazy) and all(s.startswith(named) for s in lazy)
    agree(ok, f"before-kimi on the real tree creates the Kimi transport in capture ({lazy})")


def test_draft_shares_the_forward_context_as_its_own_tree(world, with_draft, real_tree, agree):
    tree = real_tree.tree
    in_target = {id(m) for m in tree.target.modules()}
    draft = [tree.static_forward_context[name] for name in tree.draft_layers]
    ok = bool(draft) and not any(id(m) in in_target for m in draft)
    agree(ok, f"the real MTP draft is a separate tree in the forward context ({tree.draft_layers})")


def test_the_drafts_layers_are_call_sites_of_the_oracle(world, with_draft, real_tree, agree):
    """The oracle watches the draft's managers as well as the target's: each draft layer built
    a DCP manager and is a call site whose key is what that manager was built for (at the
    draft's own KV dtype under `--draft-kv-cache-dtype`), so a draft key no warm made is seen."""
    tree = real_tree.tree
    sites = {site.name: site for site in real_tree.sites}
    missing = [name for name in tree.draft_layers if name not in sites]
    wrong = [
        name
        for name in tree.draft_layers
        if name in sites
        and sites[name].manager is not tree.static_forward_context[name].dcp_manager
    ]
    agree(
        bool(tree.draft_layers) and not missing and not wrong,
        f"every draft layer is a call site with its own manager (missing {missing}, wrong {wrong})",
    )


def test_modules_only_warm_against_the_draft(
    world, with_draft, real_tree, agree, record_capture, request
):
    """A warm that walks only `model.modules()` never sees the draft. Warmed exactly with the
    keys the target's own managers were built for (so no other warm mistake can mask it):
    where the draft's keys equal the target's (same KV dtype) the dedupe makes skipping it
    harmless and nothing is lazy; where they differ (`--draft-kv-cache-dtype`) exactly the
    draft's own keys must be created in capture. The record says which case this run was."""
    tree = real_tree.tree
    sites = real_tree.sites
    draft = frozenset(tree.draft_layers)
    device = world.device.type
    target_keys = {CallSiteKey.built_for(s.call) for s in sites if s.name not in draft}
    draft_only = {CallSiteKey.built_for(s.call) for s in sites if s.name in draft} - target_keys
    differs = bool(draft_only)
    with TransportRegistry("torch", strategy=tree.spec.dcp_comm_backend) as registry:
        warmed = warm_exactly(sites, registry, tree.dcp_group, skip=draft)
        window = CaptureWindow(
            default_detectors(registry, device=registry.device), registry=registry, mode="record"
        )
        step = RealDecodeStep(sites, rank=world.rank)
        with CallSiteRouter(sites, registry, tree.dcp_group) as router:
            window.capture(step, step.make_inputs(seed=31))
    _record(
        record_capture,
        request,
        world,
        window,
        router.served,
        warm_impl="exact-keys-modules-only",
        warmed=warmed,
        negative_control=differs,
        expected_detectors=("transport-registry",) if differs else (),
    )
    lazy = {e.signature for e in window.events if e.detector == "transport-registry"}
    expected = {k.signature(device) for k in draft_only}
    case = (
        f"draft differs ({', '.join(sorted(s.describe() for s in expected))}): must be caught"
        if differs
        else "draft equals target: deduplicated, skipping it is harmless"
    )
    agree(lazy == expected, f"modules-only warm ({case}); lazy: {sorted(map(str, lazy))}")


def test_real_capture_has_no_lazy_work(
    world, warm_impl_name, warm_real, agree, record_capture, request
):
    warmed = warm_real(warm_impl_name)
    window = warmed.window("strict")
    record = functools.partial(
        _record,
        record_capture,
        request,
        world,
        window,
        warm_impl=warmed.warm_impl,
        warmed=warmed.report.signatures,
    )
    with warmed.router() as router:
        try:
            captured = window.capture(warmed.step, warmed.step.make_inputs(seed=32))
        except LazySpecializationError:
            record(router.served)
            raise
        fresh = warmed.step.make_inputs(seed=33)
        replayed = captured.replay(fresh)
        eager = warmed.step(fresh)
    record(router.served, replays=captured.replays)
    same = all(a.equal(b) for a, b in zip(replayed, eager, strict=True))
    model = warmed.built.tree.spec.model
    agree(not window.events, f"real {model}: lazy work inside capture")
    agree(router.served <= set(warmed.report.signatures), "real call sites used warmed keys")
    agree(same, f"real {model}: replay matches eager")
