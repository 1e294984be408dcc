"""Root conftest: shared by the harness's own tests (tests/) and the ranks' pytest sessions.

The qualification suites under suites/ run only on ranks under torchrun, with the rank plugin
(`-p harness.rank.plugin`); a plain `pytest` in the repository must not collect them. On a rank
this conftest tells the plugin what the rank used (`pytest_dcpqual_rank_use`), so the plugin
itself imports neither the transports nor the model trees.
"""

from __future__ import annotations

import os

import pytest

from harness.schema.plan import PLAN_ENV
from harness.schema.rank_record import RankUse

collect_ignore = [] if PLAN_ENV in os.environ else ["suites"]


@pytest.hookimpl(optionalhook=True)
def pytest_dcpqual_rank_use() -> RankUse:
    """For the rank plugin: the transports this rank created and the vLLM trees it built."""
    from harness.engine.record import engine_record
    from harness.models.real.builder import built_trees
    from harness.transport.registry import transports_used

    trees = tuple(tree.record() for tree in built_trees())
    return RankUse(transports=tuple(transports_used()), real_trees=trees, engine=engine_record())
