"""The capture check on the contrast tree (`harness.models.builders.build_contrasts`), on the
`contrast` DCP group beside the run's geometry: one tree whose layers differ in each thing the
warm code reads (TP16, TP8 and TP4; a DCP1 layer beside DCP > 1 layers; a backend named like
B12X_MLA's prefix; a layer only the module tree holds and a draft only the forward context
holds, with a key of its own; Kimi-K3's DCP size on the layer disagreeing with its impl's).

The warm must create exactly the keys the layers use: every one before the window (none created
lazily inside it) and none that no layer uses. A warm-code mistake that a uniform tree cannot
see warms a wrong key here, and the failure names it (the negative controls run each one of
`harness.capture.broken_warms.WARM_CODE_MISTAKES`).
"""

from __future__ import annotations

from harness.capture.check import capture_record, first_mismatch, signature_uses
from harness.capture.contrasts import USED, describe
from harness.capture.events import LazySpecializationError
from harness.capture.window import CaptureWindow
from harness.models.builders import CONTRASTS

REFERENCE_TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}
EAGER_TOLERANCE = {"rtol": 1.6e-2, "atol": 1e-5}


def test_contrast_tree_warms_exactly_the_keys_its_layers_use(
    contrast, contrast_keys_here, world, warm_impl_name, prepare, agree_all, record_capture, request
):
    prepared = prepare(CONTRASTS, warm_impl_name, contrast)
    step = prepared.step
    used_keys = {contrast_keys_here[name] for name in USED}
    window = CaptureWindow(prepared.detectors(), registry=prepared.registry, mode="strict")
    step.reset_used()

    def record(replays: int = 0, path: str = "") -> None:
        record_capture(
            capture_record(
                test=request.node.nodeid,
                model=CONTRASTS,
                rank=world.rank,
                path=path or ("cuda-graph" if world.device.type == "cuda" else "cpu-simulated"),
                warm_impl=prepared.warm_impl,
                events=window.events,
                statuses=window.statuses,
                signatures=signature_uses(
                    CONTRASTS, prepared.report.signatures, step.expected_signatures()
                ),
                replays=replays,
            )
        )

    try:
        captured = window.capture(step, step.make_inputs(seed=40))
    except LazySpecializationError:
        record()
        raise
    used, warmed = set(step.used_signatures), set(prepared.report.signatures)
    inputs = step.make_inputs(41)
    replayed = captured.replay(inputs)
    problems = [
        f"replay vs {label}: {mismatch}"
        for label, expected, tol in (
            ("eager", step(inputs), EAGER_TOLERANCE),
            ("reference", step.reference(41), REFERENCE_TOLERANCE),
        )
        if (mismatch := first_mismatch(replayed, expected, **tol))
    ]
    record(replays=captured.replays, path=captured.path)
    where = f"contrast tree at DCP{contrast.dcp}"
    agree_all(
        (not window.events, f"{where}: lazy work inside capture"),
        (
            used == used_keys,
            f"{where}: the layers used {describe(used)}, built to use {describe(used_keys)}",
        ),
        (not used - warmed, f"{where}: used but not warmed: {describe(used - warmed)}"),
        (not warmed - used, f"{where}: warmed but used by no layer: {describe(warmed - used)}"),
        (not problems, f"{where}: replay matches eager and reference ({problems[:1]})"),
    )
