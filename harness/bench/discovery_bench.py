"""Discovery microbenchmark: microseconds per module of the vendored discovery.

The stand-in Kimi-K3 tree (TP16/DCP16, B12X) is grown to about `modules` modules: the number of
layers comes from the measured modules-per-layer of two small builds. What is timed is one full
`discover(...)` call (model walk, forward-context walk, recognizers), not the build. The per-module
figure divides by the model's distinct modules; the per-candidate figure by everything discovery
looked at (repeats and the forward context included).
"""

from __future__ import annotations

import math
import time

from harness.bench.stats import summarize
from harness.models.builders import KIMI_MLA_EVERY, build
from harness.schema.bench import DiscoveryResult
from harness.warm.discovery import discover
from harness.warm.recognizers import WarmContext, recognizer_set

MODEL = "kimi-k3"
TP = DCP = 16


def _module_count(num_layers: int) -> int:
    return sum(1 for _ in build(MODEL, tp=TP, dcp=DCP, num_layers=num_layers).model.modules())


def layers_for(modules: int) -> int:
    """Layers (a multiple of Kimi's MLA period) whose tree has at least `modules` modules."""
    small, large = KIMI_MLA_EVERY, 2 * KIMI_MLA_EVERY
    per_layer = (_module_count(large) - _module_count(small)) / (large - small)
    fixed = _module_count(small) - per_layer * small
    layers = math.ceil(max(modules - fixed, 1) / per_layer)
    return max(KIMI_MLA_EVERY, math.ceil(layers / KIMI_MLA_EVERY) * KIMI_MLA_EVERY)


def measure_discovery(modules: int, repeats: int, warmup: int = 1) -> DiscoveryResult:
    layers = layers_for(modules)
    built = build(MODEL, tp=TP, dcp=DCP, num_layers=layers)
    count = sum(1 for _ in built.model.modules())
    context = WarmContext(dtype="bf16", max_tokens=64, dcp_world_size=DCP)
    recognizers = recognizer_set("vendored")
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        found = discover(
            built.model,
            context=context,
            recognizers=recognizers,
            static_forward_context=built.static_forward_context,
        )
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return DiscoveryResult(
        model=MODEL,
        tp=TP,
        dcp=DCP,
        layers=layers,
        modules=count,
        candidates=found.candidates_seen,
        signatures=len(found.signatures),
        seconds=summarize(times),
        us_per_module=summarize(times, 1e6 / count),
        us_per_candidate=summarize(times, 1e6 / found.candidates_seen),
    )
