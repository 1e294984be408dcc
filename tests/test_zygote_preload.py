"""Which modules the zygote preloads: vLLM's only for a run that builds real trees."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.launch.plan import RunOptions, build_plan
from harness.rank import preload
from harness.rank.preload import PRELOAD, REAL_TREE_PRELOAD, preload_for


@pytest.fixture
def vllm_found(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find(name: str, *args: object) -> object:
        return SimpleNamespace(name=name) if name == "vllm" else real(name, *args)

    monkeypatch.setattr(preload.importlib.util, "find_spec", find)


def test_vllm_is_preloaded_for_real_trees_only(vllm_found: None) -> None:
    assert preload_for("stand-in") == PRELOAD  # a stand-in run never pays for vLLM
    assert preload_for("real") == preload_for("both") == PRELOAD + REAL_TREE_PRELOAD
    assert "vllm" in REAL_TREE_PRELOAD and not any(m.startswith("vllm") for m in PRELOAD)


def test_without_vllm_a_real_run_preloads_what_a_stand_in_run_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(preload.importlib.util, "find_spec", lambda name, *a: None)
    assert preload_for("real") == PRELOAD  # the real suites skip; the zygote must still start


@pytest.mark.parametrize("models", ["stand-in", "real", "both"])
def test_the_launcher_gives_the_zygote_the_runs_modules(
    vllm_found: None, tmp_path: Path, models: str
) -> None:
    plan = build_plan(RunOptions(nproc_per_node=2, models=models), tmp_path)
    assert plan.zygote is not None
    socket = str(plan.zygote.socket)
    if models == "stand-in":  # the zygote's own default list
        assert plan.zygote.argv[-1] == socket
    else:
        assert plan.zygote.argv[-2:] == (socket, ",".join(PRELOAD + REAL_TREE_PRELOAD))
    assert build_plan(RunOptions(nproc_per_node=1, models=models), tmp_path).zygote is None
