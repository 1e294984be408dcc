"""Which pytest plugins a rank's session loads: pytest's own and the rank plugin, nothing that
merely happens to be installed. Each autoloaded plugin costs all 16 ranks its import and the
assertion rewriting of its whole distribution, and the suites use none of them.

Each case runs the rank's own pytest arguments and environment (from `build_plan`) in-process
on an empty folder, so it pins exactly what `dcpqual run` hands the ranks."""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

import pytest

from harness.launch.plan import RANK_PLUGINS, RunOptions, build_plan

OUT = Path("/tmp/dcpqual-out")


class PluginProbe:
    """Notes what the session registered, once it is configured."""

    def __init__(self) -> None:
        self.modules: set[str] = set()
        self.distributions: set[str] = set()

    def pytest_configure(self, config: pytest.Config) -> None:
        manager = config.pluginmanager
        self.modules = {
            plugin.__name__
            for _, plugin in manager.list_name_plugin()
            if isinstance(plugin, ModuleType) and not plugin.__name__.startswith("_pytest.")
        }
        self.distributions = {dist.project_name for _, dist in manager.list_plugin_distinfo()}


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    """The rank's heap plugin freezes this process's heap and toggles its collector: undone."""
    yield
    gc.unfreeze()
    gc.enable()


def rank_session(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    user_args: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
) -> PluginProbe:
    """Configure a session with the ranks' pytest arguments (the user's after the target) and
    environment; the target is an empty folder, so nothing is imported into this process."""
    plan = build_plan(RunOptions(nproc_per_node=2, pytest_args=(str(tmp_path), *user_args)), OUT)
    argv = list(plan.argv)
    pytest_argv = argv[argv.index("pytest") + 1 :]
    for name, value in (plan.env if env is None else env).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("PYTEST_PLUGINS", raising=False)
    monkeypatch.chdir(tmp_path)
    probe = PluginProbe()
    # The rank plugin may be imported here already, so pytest cannot rewrite it (and says so).
    quiet = ["-W", "ignore::pytest.PytestAssertRewriteWarning", "-q", "--co"]
    code = pytest.main([*pytest_argv, *quiet], plugins=[probe])
    assert code == pytest.ExitCode.NO_TESTS_COLLECTED
    return probe


def test_a_rank_loads_the_rank_plugin_and_no_installed_plugin(tmp_path, monkeypatch):
    probe = rank_session(tmp_path, monkeypatch)
    assert probe.modules - {"conftest"} == set(RANK_PLUGINS)
    assert RANK_PLUGINS == ("harness.rank.outrelay", "harness.rank.heap", "harness.rank.plugin")
    assert probe.distributions == set()


def test_without_the_rank_environment_installed_plugins_would_load(tmp_path, monkeypatch):
    """The control: this environment has entry-point plugins (xdist, hypothesis, timeout from
    `.[dev]`), so the case above sees none only because the ranks turn autoload off."""
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    probe = rank_session(tmp_path, monkeypatch, env={})
    assert {"pytest-xdist", "pytest-timeout", "hypothesis"} <= probe.distributions


def test_a_user_names_an_installed_plugin_in_pytest_args(tmp_path, monkeypatch):
    """`dcpqual run -- ... -p timeout --timeout 60`: the entry-point name loads that plugin
    (and its options parse); the others stay out."""
    probe = rank_session(tmp_path, monkeypatch, ("-p", "timeout", "--timeout", "60"))
    assert probe.distributions == {"pytest-timeout"}
