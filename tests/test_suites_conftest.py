"""The suites' collection order, every rank alike: the transport suite first (it needs no model
and no warm implementation, and the capture suite's off-rank control process finishes meanwhile),
everything else in collection order; the models a run does not qualify are deselected."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from harness.schema.plan import RankPlan

SUITES = Path(__file__).resolve().parent.parent / "suites"
COLLECTED = (
    "suites/capture/test_negative_controls.py::test_detector_control[dynamo]",
    "suites/capture/test_capture.py::test_capture_has_no_lazy_work[kimi-k3]",
    "suites/real/test_real_trees.py::test_real_capture_has_no_lazy_work",
    "suites/transport/test_gather.py::test_gather_is_bit_exact[2-kimi-k3-bf16]",
    "suites/transport/test_reduce.py::test_one_hot_routing_is_exact[16]",
    "suites/warmup/test_warmup.py::test_kimi_k3_signature_at_the_run_geometry",
)


@pytest.fixture(scope="module")
def conftest() -> ModuleType:
    spec = importlib.util.spec_from_file_location("suites_root_conftest", SUITES / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses
    spec.loader.exec_module(module)
    return module


@dataclass
class Item:
    nodeid: str


@dataclass
class Rank:
    """What the hook asks of the rank plugin: its plan, and where deselected items go."""

    plan: RankPlan
    left_out: list[str] = field(default_factory=list)

    def left_out_by_model_source(self, items: list[Item]) -> None:
        self.left_out += [item.nodeid for item in items]


@dataclass
class Config:
    rank: Rank
    deselected: list[str] = field(default_factory=list)

    @property
    def pluginmanager(self) -> Any:
        return self

    def get_plugin(self, name: str) -> Rank | None:
        return self.rank if name == "dcpqual-rank" else None

    @property
    def hook(self) -> Any:
        return self

    def pytest_deselected(self, items: list[Item]) -> None:
        self.deselected += [item.nodeid for item in items]


def _order(conftest: ModuleType, models: str) -> tuple[list[str], Config]:
    config = Config(Rank(RankPlan(models=models)))
    items = [Item(nodeid) for nodeid in COLLECTED]
    conftest.pytest_collection_modifyitems(config, items)
    return [item.nodeid for item in items], config


def test_the_transport_suite_runs_first_and_the_rest_keep_their_order(conftest) -> None:
    order, config = _order(conftest, "both")
    assert order == [*COLLECTED[3:5], *COLLECTED[:3], COLLECTED[5]]
    assert config.deselected == [] and config.rank.left_out == []


@pytest.mark.parametrize(
    "models, dropped",
    [("stand-in", ("suites/real/",)), ("real", ("suites/capture/", "suites/warmup/"))],
)
def test_the_models_a_run_does_not_qualify_are_deselected_after_ordering(
    conftest, models, dropped
) -> None:
    order, config = _order(conftest, models)
    gone = [nodeid for nodeid in COLLECTED if nodeid.startswith(dropped)]
    assert config.deselected == config.rank.left_out == gone
    kept = [*COLLECTED[3:5], *(n for n in COLLECTED[:3] + COLLECTED[5:] if n not in gone)]
    assert order == kept
