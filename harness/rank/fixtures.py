"""Fixtures the rank plugin provides to every suite it runs: the plan, the world, the capture
record hand-off. Registered with the plugin module, so a suite asks for them by name and never
reads the launcher's settings from the environment itself."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from harness.schema.capture import CaptureRecord
from harness.schema.plan import RankPlan

PLUGIN_NAME = "dcpqual-rank"


@dataclass(frozen=True)
class World:
    """This rank's place in the default process group, and the device its tensors live on."""

    rank: int
    size: int
    backend: str
    device: torch.device


def plan_of(config: pytest.Config) -> RankPlan:
    """The plugin's plan; outside `dcpqual run` (no plugin) the one in the environment, else
    the defaults."""
    plan = getattr(config.pluginmanager.get_plugin(PLUGIN_NAME), "plan", None)
    if isinstance(plan, RankPlan):
        return plan
    return RankPlan.from_environ(os.environ) or RankPlan()


@pytest.fixture(scope="session")
def rank_plan(request: pytest.FixtureRequest) -> RankPlan:
    """What `dcpqual run` asked every rank for (geometry, warm code, models, out folder)."""
    return plan_of(request.config)


@pytest.fixture(scope="session")
def world(rank_plan: RankPlan) -> World:
    """The default process group (the plugin initialized it before collection; a torchrun
    started by hand gets one here from torchrun's environment)."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            pytest.exit("suites/ must run under torchrun (use `dcpqual run`)", returncode=2)
        dist.init_process_group(backend=rank_plan.backend, timeout=timedelta(seconds=120))
    backend = str(dist.get_backend())
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    else:
        device = torch.device("cpu")
    return World(rank=dist.get_rank(), size=dist.get_world_size(), backend=backend, device=device)


@pytest.fixture
def record_capture(request: pytest.FixtureRequest) -> Callable[[CaptureRecord], None]:
    """Hand a capture record to the rank plugin for records/rank-NN.json."""
    add: Callable[[CaptureRecord], None] | None = getattr(
        request.config.pluginmanager.get_plugin(PLUGIN_NAME), "add_capture", None
    )
    return add if add is not None else (lambda record: None)  # by hand: outside `dcpqual run`
