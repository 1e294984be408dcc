"""bench/reduction_floor.py: every step it names is timed, and each strategy is compared with the
fastest of its one-pass candidates."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "reduction_floor.py"


@pytest.fixture(scope="module")
def floor() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reduction_floor", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_step_it_compares_is_timed_in_one_process(floor: ModuleType) -> None:
    threads = torch.get_num_threads()
    try:
        seconds = floor.time_steps(batch=2, iters=3, warmup=1, seed=0)
    finally:
        torch.set_num_threads(threads)
    named = {n for names in (*floor.TRANSPORT.values(), *floor.FLOORS.values()) for n in names}
    assert set(floor.REDUCTION.values()) <= named
    assert named | set(floor.REFERENCE) == set(seconds)
    assert all(len(s) == 3 and min(s) > 0 for s in seconds.values())


def test_each_strategy_is_read_against_its_fastest_one_pass_candidate(floor: ModuleType) -> None:
    ms = {
        "ag_rs upcast copy": 1.0, "ag_rs fused multiply": 4.0, "ag_rs weights": 0.5,
        "ag_rs scale_into": 2.5, "ag_rs result": 0.25, "a2a sum": 3.0, "a2a copy": 2.0,
        "a2a pack": 1.0, "a2a weights": 0.5, "a2a StagedAccumulation": 4.0, "a2a result": 0.5,
        "a2a accumulate_into": 9.0,
    }  # fmt: skip
    lines = floor.report({n: np.array([v, v, 10 * v]) / 1e3 for n, v in ms.items()})
    assert lines[-2] == (
        "ag_rs: one-pass floor 1.00 ms; ag_rs scale_into 2.50 ms = 2.50x; "
        "transport's local steps 3.25 ms = 3.25x"
    )
    assert lines[-1] == (
        "a2a: one-pass floor 2.00 ms; a2a StagedAccumulation 4.00 ms = 2.00x; "
        "transport's local steps 6.00 ms = 3.00x"
    )


def test_the_a2a_steps_run_on_the_transports_packing_and_its_staged_accumulation(
    floor: ModuleType,
) -> None:
    """Packed as the transport packs (destination r's chunk holds heads [6r, 6r + 6), each
    chunk's LSEs after its outputs), and the staged reduction timed is the accumulation bit
    for bit, at each batch's group size (16, 5 and 1 sources per op)."""
    for batch in (1, 8, 64):
        work = floor.steps(batch=batch, seed=3)
        by_destination = work["ag_rs upcast copy"]()  # the partial [W, B, h, D], in fp32
        outputs, lses = work["a2a pack"]()
        assert outputs.untyped_storage().data_ptr() == lses.untyped_storage().data_ptr()
        assert torch.equal(outputs.float(), by_destination)
        staged = work["a2a StagedAccumulation"]().clone()
        unstaged = work["a2a accumulate_into"]()
        assert torch.equal(staged.view(torch.int32), unstaged.view(torch.int32)), batch
