"""Rank side of the capture-overhead measurement: what the capture machinery costs eager code
while no window is open.

Three registries holding the same warmed transport, used in the same iterations:
- `plain`: never seen by the capture machinery, nothing subscribed (the baseline);
- `after_window`: the default detector set was built against it and a `CaptureWindow` was
  opened and closed over it (every hook installed, then removed) -- the state a serving process
  is in between captures; this is the measured overhead;
- `noop_subscriber`: a no-op callback stays subscribed (for reference: what a detector that
  forgot to unsubscribe would cost).

Two things are timed per variant: an eager decode step (`registry.get` + gather + reduction, a
collective, so every rank starts together) and registry lookups alone (a local loop of `get`
hits, per call, on rank 0 only while the other ranks wait). If the capture package is not
importable, `after_window` is left out and the reason is reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness.bench.rank_env import RankEnv
from harness.bench.rank_transport import Inputs, kimi_signature, run_interleaved
from harness.transport.registry import TransportRegistry
from harness.transport.torch_backend import TorchDCPTransport
from harness.warm.signature import TransportSignature


def open_and_close_window(registry: TransportRegistry, sig: TransportSignature) -> str | None:
    """Build the default detectors on `registry`, open and close one window (a hit inside);
    None on success, else why the capture machinery could not be set up."""
    try:
        from harness.capture.check import default_detectors
        from harness.capture.window import CaptureWindow
    except ImportError as exc:
        return f"capture API not importable ({exc})"
    window = CaptureWindow(default_detectors(registry, device=registry.device), registry=registry)
    with window.watching():
        registry.get(sig)
    return None


def step_op(registry: TransportRegistry, sig: TransportSignature, x: Inputs) -> Callable[[], None]:
    def step() -> None:
        transport = registry.get(sig)
        assert isinstance(transport, TorchDCPTransport)
        transport.gather_queries(x.q, out=x.gathered)
        transport.reduce_outputs(x.part, x.lse, out=x.reduced)

    return step


def lookup_rounds(
    registries: dict[str, TransportRegistry], sig: TransportSignature, rounds: int, loops: int
) -> dict[str, list[float]]:
    """Seconds per `get` hit, one value per round, variants rotated each round (local only)."""
    names = list(registries)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            get = registries[name].get
            t0 = time.perf_counter()
            for _ in range(loops):
                get(sig)
            out[name].append((time.perf_counter() - t0) / loops)
    return out


def measure_capture_overhead(
    env: RankEnv,
    *,
    strategy: str,
    batch: int,
    warmup: int,
    iters: int,
    lookup_rounds_n: int,
    lookup_loops: int,
) -> dict[str, Any]:
    sig = kimi_signature(env.world_size, batch, env.device.type)
    registries = {
        name: TransportRegistry("torch", strategy, env.device)
        for name in ("plain", "after_window", "noop_subscriber")
    }
    try:
        for registry in registries.values():
            registry.get_or_create(sig)
        unavailable = open_and_close_window(registries["after_window"], sig)
        if unavailable is not None:
            registries.pop("after_window").close()
        registries["noop_subscriber"].subscribe(lambda event: None)
        x = Inputs.make(sig, batch, env.device, seed=7 + env.rank)
        sides = {name: {"step": step_op(reg, sig, x)} for name, reg in registries.items()}
        steps = run_interleaved(env, sides, warmup, iters)
        # Lookups are local: only rank 0 loops, the others wait, so oversubscribed cores (16
        # ranks on a small machine) do not turn descheduling into "lookup time".
        lookups = (
            lookup_rounds(registries, sig, lookup_rounds_n, lookup_loops) if env.rank == 0 else {}
        )
        env.barrier()
    finally:
        for registry in registries.values():
            registry.close()
    return {
        "strategy": strategy,
        "batch": batch,
        "unavailable": unavailable,
        "step": {name: side["step"] for name, side in steps.items()},
        "lookup": lookups,
    }
