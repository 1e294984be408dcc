"""A warm that sizes its transports by another token capacity than the runtime is caught.

Every fork registry looks transports up by exact token capacity. The seed's warm (the vendored
one) sizes them by `max_num_batched_tokens`; the fork's runtime caps them (`B12X_DECODE_TOKEN_CAP
= 8` in its later eras, `VLLM_DCP_A2A_MAX_TOKENS` in every era; `harness.core.capacity`). Where
the two differ, the transport the layer asks for in capture was never warmed: a pool miss that
creates it inside the window, named with its runtime key. The aligned case (the same engine,
warmed at the runtime's capacity) shows that the capacity alone makes the difference.

Kimi-K3 only, in record mode (the step runs on, so every rank takes the same collectives).
The vendored warm failing the mismatched cases is a finding (README qualification table), not a
failure of this suite: what is checked is that the harness sees it.
"""

from __future__ import annotations

import dataclasses

import pytest

from harness.capture.window import CaptureWindow
from harness.core.capacity import RuntimeCapacity
from harness.warm.warmup import warm

MODEL = "kimi-k3"
CASES = {
    # fork eras C/D: the decode cap (8) under a 64-token engine; the warm sizes by 64
    "decode-cap": (64, RuntimeCapacity("decode-cap")),
    # any era: VLLM_DCP_A2A_MAX_TOKENS=4 under the default 8-token engine
    "env-cap": (8, RuntimeCapacity("engine", 4)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_warm_sized_unlike_the_runtime_is_caught_naming_the_runtime_key(
    case, world, prepare, agree_all
):
    batched, runtime = CASES[case]
    expected = runtime.tokens(batched)
    prepared = prepare(MODEL, "vendored", max_num_batched_tokens=batched, runtime=runtime)
    step = prepared.step
    window = CaptureWindow(prepared.detectors(), registry=prepared.registry, mode="record")
    window.capture(step, step.make_inputs(seed=40))
    warmed = {s.max_tokens for s in prepared.report.signatures}
    named = {e.signature.max_tokens for e in window.events if e.signature is not None}
    agree_all(
        (warmed == {batched}, f"{case}: the vendored warm sized by {batched} ({warmed})"),
        (bool(window.events), f"{case}: the runtime's {expected}-token key missed in capture"),
        (named == {expected}, f"{case}: events name the runtime key max_tokens={expected}"),
    )

    # The aligned control: the same tree, warmed at the runtime's capacity, captures cleanly.
    context = dataclasses.replace(prepared.context, max_tokens=expected)
    aligned = prepare(MODEL, "vendored", max_num_batched_tokens=batched, runtime=runtime)
    warm(
        aligned.built.model,
        registry=aligned.registry,
        context=context,
        group=aligned.step.group,
        static_forward_context=aligned.built.static_forward_context,
    )
    clean = CaptureWindow(aligned.detectors(), registry=aligned.registry, mode="record")
    clean.capture(aligned.step, aligned.step.make_inputs(seed=41))
    agree_all((not clean.events, f"{case}: warmed at {expected} tokens, nothing lazy"))
