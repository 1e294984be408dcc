"""What a rank used, for the rank plugin's `pytest_dcpqual_rank_use` hook: the transports it
created, the vLLM trees it built and its engine lane's record. Answered by the repository's
root conftest and by the suites' own (so the suites an installed wheel carries answer it too,
without the checkout)."""

from __future__ import annotations

from harness.schema.rank_record import RankUse


def rank_use() -> RankUse:
    from harness.engine.record import engine_record
    from harness.models.real.builder import built_trees
    from harness.transport.registry import transports_used

    trees = tuple(tree.record() for tree in built_trees())
    return RankUse(transports=tuple(transports_used()), real_trees=trees, engine=engine_record())
