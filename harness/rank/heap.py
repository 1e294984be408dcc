"""The rank's garbage collector ("dcpqual-heap"), loaded first on every rank (`-p
harness.rank.heap`, before the rank plugin): off while start-up builds the heap that lives as long
as the rank, then that heap frozen and collection back on for the tests.

Why: importing torch, the harness and the suites makes about 200k objects that never become
garbage, yet every full collection walks all of them: three during torch's import alone, more
during the tests, and pytest's own at the end (it looks for failing finalizers). That is tenths
of a CPU-second on every rank, times 16 ranks on a few cores. Frozen (`gc.freeze`), they are out
of the collector's reach; what the tests create is still collected, and a finalizer error in it
still reported. The little garbage start-up makes is frozen with the rest (Python's documented
pattern for long-lived heaps: disable early, freeze, enable).

Its import is also where a forked rank re-issues what the forkserver's preload warned
(`harness.core.preloaded`): pytest imports it under the same filters a cold rank's imports of
torch and the harness meet here.

Inert unless named with `-p`: the launcher names it for the ranks only.
"""

from __future__ import annotations

import gc

import pytest

from harness.core import preloaded
from harness.rank import openfiles

preloaded.reissue(preloaded.STARTUP)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Called as this plugin registers, before the next `-p` plugin (the rank plugin, and with
    it torch) is imported: no collections while the long-lived heap is built."""
    gc.disable()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Every module and test is loaded: freeze what exists, collect what the tests make."""
    openfiles.freeze()  # its files still flushed at the rank's exit
    gc.enable()
