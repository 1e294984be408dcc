"""The capture check again at a held-out geometry on the same ranks (`held_out`: TP16/DCP4
beside TP16/DCP16 on 16 ranks), where the DCP group is a proper subgroup of the world and
tp != dcp. At TP16/DCP16 a warm that ignores its DCP group, or reads local heads as
num_heads // dcp, warms exactly what the step uses; here it cannot (the negative controls show
both caught). Kimi-K3 only: the one model whose recognizer reads both tp- and dcp-derived
values, and one model keeps cpu16's added time small.
"""

from __future__ import annotations

from harness.capture.check import capture_record, first_mismatch, signature_uses
from harness.capture.events import LazySpecializationError
from harness.capture.window import CaptureWindow

MODEL = "kimi-k3"
REFERENCE_TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}
EAGER_TOLERANCE = {"rtol": 1.6e-2, "atol": 1e-5}


def test_kimi_capture_has_no_lazy_work_at_the_held_out_geometry(
    held_out, world, warm_impl_name, prepare, agree_all, record_capture, request
):
    prepared = prepare(MODEL, warm_impl_name, held_out)
    step = prepared.step
    window = CaptureWindow(prepared.detectors(), registry=prepared.registry, mode="strict")
    step.reset_used()
    used = step.expected_signatures()

    def record(replays: int = 0, path: str = "") -> None:
        record_capture(
            capture_record(
                test=request.node.nodeid,
                model=MODEL,
                rank=world.rank,
                path=path or ("cuda-graph" if world.device.type == "cuda" else "cpu-simulated"),
                warm_impl=prepared.warm_impl,
                events=window.events,
                statuses=window.statuses,
                signatures=signature_uses(MODEL, prepared.report.signatures, used),
                replays=replays,
            )
        )

    try:
        captured = window.capture(step, step.make_inputs(seed=30))
    except LazySpecializationError:
        record()
        raise
    used = step.used_signatures
    inputs = step.make_inputs(31)
    replayed = captured.replay(inputs)
    problems = [
        f"replay vs {label}: {mismatch}"
        for label, expected, tol in (
            ("eager", step(inputs), EAGER_TOLERANCE),
            ("reference", step.reference(31), REFERENCE_TOLERANCE),
        )
        if (mismatch := first_mismatch(replayed, expected, **tol))
    ]
    record(replays=captured.replays, path=captured.path)
    where = f"{MODEL} at TP{held_out.tp}/DCP{held_out.dcp}"
    agree_all(
        (not window.events, f"{where}: lazy work inside capture"),
        (set(used) == set(step.expected_signatures()), f"{where}: step used every transport"),
        (set(used) <= set(prepared.report.signatures), f"{where}: used signatures were warmed"),
        (not problems, f"{where}: replay matches eager and reference ({problems[:1]})"),
    )
