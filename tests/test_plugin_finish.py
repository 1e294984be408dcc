"""What the rank plugin leaves out at the end of a session: Hypothesis's terminal summary, where
no Hypothesis code ran (it would import Hypothesis on every rank only to report nothing)."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from harness.rank.plugin import HYPOTHESIS_PLUGIN, drop_unused_hypothesis


class Summary:
    """Stands in for a plugin with a terminal summary."""

    def pytest_terminal_summary(self) -> None:
        pass


def manager_with(name: str) -> tuple[pytest.PytestPluginManager, Summary]:
    manager = pytest.PytestPluginManager()
    plugin = Summary()
    manager.register(plugin, name)
    return manager, plugin


def test_the_summary_of_a_hypothesis_that_never_ran_is_dropped():
    manager, plugin = manager_with(HYPOTHESIS_PLUGIN)
    assert drop_unused_hypothesis(manager, modules={"pytest": pytest})
    assert manager.get_plugin(HYPOTHESIS_PLUGIN) is None and not manager.is_registered(plugin)


def test_hypothesis_that_ran_keeps_its_summary():
    manager, plugin = manager_with(HYPOTHESIS_PLUGIN)
    assert not drop_unused_hypothesis(manager, modules={"hypothesis": object()})
    assert manager.get_plugin(HYPOTHESIS_PLUGIN) is plugin


def test_other_plugins_are_left_alone():
    manager, plugin = manager_with("somebody-else")
    assert not drop_unused_hypothesis(manager, modules={})
    assert manager.get_plugin("somebody-else") is plugin


def test_the_name_is_hypothesis_own_pytest_entry_point():
    plugins = {e.name: e.value for e in entry_points(group="pytest11")}
    assert plugins[HYPOTHESIS_PLUGIN] == "_hypothesis_pytestplugin"
