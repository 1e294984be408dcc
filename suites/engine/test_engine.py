"""The engine lane: vLLM's own engine started under the detectors on every rank.

File order is the lane's order: startup checks, a clean decode (the replay steps), tokens
across ranks, the negative controls (before capture: not lazy; inside a lazy phase: caught),
the DCP path's served counts, and last the `enforce_eager` reference (it tears the engine
down). Every test leaves the rank's engine record current.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch.distributed as dist

from harness.engine.lane import EngineRun, eager_reference, engine_record_of
from harness.engine.record import set_engine_record
from harness.engine.watch import hooked_once


def _keep(run: EngineRun) -> None:
    set_engine_record(engine_record_of(run))


def _all(value: object) -> list[object]:
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def test_startup_ran_vllms_own_warm_under_armed_seams(engine: EngineRun) -> None:
    watch = engine.watch
    _keep(engine)
    for seam in ("torch.distributed.new_group", "capture_model", "compile_or_warm_up_model"):
        assert watch.seams.get(seam) == "armed", f"{seam}: {watch.seams.get(seam)}"
    assert watch.entered["warm"] >= 1, "vLLM's worker never ran compile_or_warm_up_model"
    if engine.gpu and engine.policy["cudagraph_mode"] != "NONE":
        assert watch.entered["capture"] >= 1, "vLLM's model runner never ran capture_model"
    startup = [c for c in watch.created if c.phase in ("load", "warm")]
    assert any(c.kind == "process-group" for c in startup), (
        "vLLM formed its groups without torch.distributed.new_group: the seam saw nothing"
    )
    lazy = watch.lazy()
    assert not lazy, "created inside capture: " + "; ".join(f"{c.kind} {c.what}" for c in lazy)


def test_decode_steps_create_nothing(engine: EngineRun) -> None:
    before = len(engine.watch.created)
    engine.tokens = engine.decode()
    _keep(engine)
    made = engine.watch.created[before:]
    assert not made, "created during decode: " + "; ".join(
        f"{c.kind} {c.what} at {c.stack[-1] if c.stack else '?'}" for c in made
    )
    assert all(len(t) > 0 for t in engine.tokens)


def test_tokens_identical_on_every_rank(engine: EngineRun) -> None:
    everyone = _all(engine.tokens)
    _keep(engine)
    assert all(t == everyone[0] for t in everyone), f"tokens differ across ranks: {everyone}"


def _new_group() -> None:
    dist.new_group(ranks=list(range(dist.get_world_size())))


def _b12x_transport() -> None:
    """b12x's own pool constructor (the CUDA work after the hook fails without a GPU)."""
    from b12x.comm.pcie.api import DcpAllToAllPool

    with contextlib.suppress(Exception):  # what follows the constructor's hook is CUDA work
        DcpAllToAllPool(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            device="cpu",
            max_batch_size=8,
            total_heads=96,
            head_dim=512,
            query_head_dim=576,
        )


def _kernel() -> None:
    """b12x's kernel-resolution gate, as its compile paths call it for every new kernel."""
    import b12x._lib.runtime_control as rc

    rc.raise_if_kernel_resolution_frozen("cute.compile", target=_kernel)


ACTIONS: dict[str, Callable[[], None]] = {
    "new-group": _new_group,
    "b12x-transport": _b12x_transport,
    "kernel": _kernel,
}


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_control_before_capture_is_not_lazy(engine: EngineRun, action: str) -> None:
    start = len(engine.watch.created)
    ACTIONS[action]()
    item = engine.control(action, "before-capture", engine.watch.phase, start)
    _keep(engine)
    assert len(engine.watch.created) > start, f"the {action} seam saw nothing"
    assert not item.caught, f"{action} after startup, before decode, was called lazy"


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_control_inside_vllms_lazy_phase_is_caught(engine: EngineRun, action: str) -> None:
    """The hook rides vLLM's own call of the live model's forward. Where CUDA graphs replay
    (no Python forward), it rides vLLM's own `capture_model`, run once more on the live
    engine; on CPU (no graphs) it rides the decode steps, which stand in for capture."""
    model = engine.model_runner.model
    start = len(engine.watch.created)
    with hooked_once(model, "forward", ACTIONS[action]):
        if engine.gpu and engine.policy.get("cudagraph_mode", "NONE") != "NONE":
            engine.model_runner.capture_model()
        else:
            engine.decode()
    made = engine.watch.created[start:]
    phase = made[0].phase if made else engine.watch.phase
    item = engine.control(action, "lazy-phase", phase, start)
    _keep(engine)
    assert made, f"the {action} hook never ran inside vLLM's forward"
    assert item.caught, f"{action} inside vLLM's {phase} phase was not caught as lazy"


def test_dcp_calls_took_the_b12x_path(engine: EngineRun) -> None:
    record = engine_record_of(engine)
    _keep(engine)
    assert record.other_calls() == 0, f"DCP calls that b12x did not serve: {record.served}"
    if engine.gpu and engine.dcp > 1:
        assert record.b12x_calls("decode") > 0, "b12x served no decode DCP call"


def test_tokens_equal_enforce_eager(engine: EngineRun) -> None:
    """Graphs replayed = eager (on CPU both engines are eager: vLLM's CPU path, compiled with
    its CPU backend, against its own enforce_eager path)."""
    eager = eager_reference(engine, engine.folder, dist.get_rank())  # type: ignore[attr-defined]
    _keep(engine)
    assert eager == engine.tokens, f"engine {engine.tokens} != enforce_eager {eager}"
