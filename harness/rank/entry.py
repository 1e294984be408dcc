"""dcpqual's `pytest11` entry point (`dcpqual`): the rank plugin for someone else's suite.

Installed, pytest loads this module in every session; it imports nothing heavy and does nothing
unless the session is a torchrun rank (RANK and WORLD_SIZE set) whose launcher did not already
name the rank plugin. Under torchrun it registers `harness.rank.plugin`, so

    torchrun --nproc-per-node 4 -m pytest tests/distributed/

runs every test in lockstep on every rank, agrees on each outcome and names the rank that
failed first, as `dcpqual run` does with its suites. `-p no:dcpqual` turns it off;
`dcpqual run` loads the plugin by its module name and never needs this entry point.
"""

from __future__ import annotations

import os

import pytest

RANK_PLUGIN = "harness.rank.plugin"


def under_torchrun(environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return "RANK" in env and "WORLD_SIZE" in env


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Register the rank plugin on a torchrun rank; its own (historic) configure then runs at
    once, still ahead of junitxml's, as it would have loaded with `-p harness.rank.plugin`."""
    if not under_torchrun() or config.pluginmanager.has_plugin(RANK_PLUGIN):
        return
    import importlib

    config.pluginmanager.register(importlib.import_module(RANK_PLUGIN), RANK_PLUGIN)
