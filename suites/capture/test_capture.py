"""The check the project exists for: after warmup, capturing a decode step does no lazy work.

For each model: warm with the run's warm implementation (`dcpqual run --warm-impl`, default
"vendored") on the whole model, MTP head included; capture one decode step through every
attention layer's transport in a strict window (every detector that can run here); replay it
with fresh inputs; compare with the eager step and with the whole-context reference. Zero lazy
events on every rank, agreed by a collective.

Under `--warm-impl before-kimi` the Kimi-K3 and mixed tests fail on every rank, naming the Kimi
signature that would be created lazily: that is the bug the seed change fixed.
"""

from __future__ import annotations

import pytest

from harness.capture.check import capture_record, first_mismatch, signature_uses
from harness.capture.events import LazySpecializationError
from harness.capture.window import CaptureWindow

MODELS = ("kimi-k3", "deepseek-v4", "mixed")
REPLAY_SEEDS = (11, 12)
# bf16 outputs: the transport rounds the partials to bf16 before the LSE-weighted reduction.
REFERENCE_TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}
# Replay against eager: the same ops on the same inputs (bit-identical on the CPU simulation).
EAGER_TOLERANCE = {"rtol": 1.6e-2, "atol": 1e-5}


@pytest.mark.parametrize("model", MODELS)
def test_capture_has_no_lazy_work(
    model, world, warm_impl_name, prepare, agree_all, record_capture, request
):
    prepared = prepare(model, warm_impl_name)
    step = prepared.step
    window = CaptureWindow(prepared.detectors(), registry=prepared.registry, mode="strict")

    def record(replays: int = 0, path: str = "") -> None:
        record_capture(
            capture_record(
                test=request.node.nodeid,
                model=model,
                rank=world.rank,
                path=path or ("cuda-graph" if world.device.type == "cuda" else "cpu-simulated"),
                warm_impl=prepared.warm_impl,
                events=window.events,
                statuses=window.statuses,
                signatures=signature_uses(model, prepared.report.signatures, used),
                replays=replays,
            )
        )

    step.reset_used()
    used = step.expected_signatures()  # what the step asks for, if capture stops at the first
    try:
        captured = window.capture(step, step.make_inputs(seed=10))
    except LazySpecializationError:
        record()
        raise
    used = step.used_signatures

    problems = []
    for seed in REPLAY_SEEDS:
        inputs = step.make_inputs(seed)
        replayed = captured.replay(inputs)
        for label, expected, tol in (
            ("eager", step(inputs), EAGER_TOLERANCE),
            ("reference", step.reference(seed), REFERENCE_TOLERANCE),
        ):
            mismatch = first_mismatch(replayed, expected, **tol)
            if mismatch:
                problems.append(f"replay (seed {seed}) vs {label}: {mismatch}")
    record(replays=captured.replays, path=captured.path)

    agree_all(
        (not window.events, f"{model}: lazy work inside capture"),
        (set(used) == set(step.expected_signatures()), f"{model}: step used every transport"),
        (set(used) <= set(prepared.report.signatures), f"{model}: used signatures were warmed"),
        (not problems, f"{model}: replays match eager and reference ({problems[:1]})"),
    )
