"""The engine lane's receipt facts, derived from the rank records alone (`extra.engine`).

Tokens are compared across ranks here, from what each rank recorded, not from what any rank
said about its peers; the counts are sums over the ranks' own events and served calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.schema.base import Limitation
from harness.schema.rank_record import EngineRecord, RankRecord
from harness.schema.receipt import EngineLane, NegativeControl

# The phases whose DCP calls must be b12x's (vLLM's own capture, and decode that replays it).
SERVED_PHASES = frozenset({"capture", "decode"})
# What identifies an engine configuration (the rest is what it cost or saw on one rank).
IDENTITY = (
    "model",
    "architecture",
    "vllm_version",
    "vllm_path",
    "vllm_commit",
    "tp",
    "dcp",
    "engine_args",
    "engine_env",
    "cudagraph_mode",
    "capture_sizes",
    "max_num_batched_tokens",
    "kv_cache_dtype",
    "attention_backend",
    "graphs",
)


def _identity(record: EngineRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in IDENTITY:
        value = getattr(record, name)
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def _entered(record: EngineRecord, phase: str) -> int:
    return sum(p.entered for p in record.phases if p.name == phase)


def engine_lane(records: Mapping[int, RankRecord]) -> EngineLane | None:
    """None when no rank ran the engine lane."""
    engines = {r: rec.extra.engine for r, rec in sorted(records.items()) if rec.extra.engine}
    if not engines:
        return None
    configs: list[dict[str, Any]] = []
    phases: dict[str, float] = {}
    b12x: dict[str, int] = {}
    limitations: dict[str, Limitation] = {}
    lazy = controls = caught = false = other = 0
    for engine in engines.values():
        if (identity := _identity(engine)) not in configs:
            configs.append(identity)
        for phase in engine.phases:
            phases[phase.name] = max(phases.get(phase.name, 0.0), phase.seconds)
        lazy += sum(1 for e in engine.events if e.lazy and e.control is None)
        controls += sum(1 for c in engine.controls if c.where == "lazy-phase")
        caught += sum(1 for c in engine.controls if c.where == "lazy-phase" and c.caught)
        false += sum(1 for c in engine.controls if c.where == "before-capture" and c.caught)
        for served in engine.served:
            if served.path.startswith("b12x:"):
                b12x[served.phase] = b12x.get(served.phase, 0) + served.calls
            elif served.phase in SERVED_PHASES:  # the calls capture and replay make
                other += served.calls
        for item in engine.limitations:
            limitations.setdefault(item.key, item)
    tokens = [e.tokens for e in engines.values()]
    return EngineLane(
        ranks=list(engines),
        engines=configs,
        phases_s_max=phases,
        warm_ran=all(_entered(e, "warm") > 0 for e in engines.values()),
        capture_ran=all(_entered(e, "capture") > 0 for e in engines.values()),
        lazy_events=lazy,
        controls=controls,
        controls_caught=caught,
        controls_false=false,
        b12x_calls=dict(sorted(b12x.items())),
        other_calls=other,
        tokens_agree=bool(tokens[0]) and all(t == tokens[0] for t in tokens),
        eager_equal=all(
            bool(e.eager_tokens) and e.eager_tokens == e.tokens for e in engines.values()
        ),
        build_s_max=max(e.build_s for e in engines.values()),
        peak_rss_mib_max=max(e.peak_rss_mib for e in engines.values()),
        limitations=list(limitations.values()),
    )


def with_engine_controls(
    negative: NegativeControl, records: Mapping[int, RankRecord]
) -> NegativeControl:
    """The run's negative controls with the engine lane's folded in: each lazy-phase control is
    a window that provokes lazy work on purpose (a test-only hook inside vLLM's own capture or
    decode), detected when the watch named it lazy; its events count under `engine:<kind>`.
    Before-capture controls are not windows that must fire (one caught is a failure of its own,
    `controls_false`), so they are left out."""
    expected, detected, lazy = negative.expected, negative.detected, negative.lazy_events
    by_detector, missed = dict(negative.by_detector), list(negative.missed)
    for rank, record in sorted(records.items()):
        if (engine := record.extra.engine) is None:
            continue
        for control in (c for c in engine.controls if c.where == "lazy-phase"):
            expected += 1
            detected += control.caught
            if not control.caught:
                missed.append(f"rank {rank}: engine lane {control.action} ({control.phase})")
        for event in (e for e in engine.events if e.lazy and e.control is not None):
            lazy += 1
            key = f"engine:{event.kind}"
            by_detector[key] = by_detector.get(key, 0) + 1
    return NegativeControl(
        expected=expected,
        detected=detected,
        lazy_events=lazy,
        by_detector=dict(sorted(by_detector.items())),
        missed=missed,
    )
