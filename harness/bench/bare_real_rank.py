"""The bare real-tree launch a `dcpqual run --models real` is compared with.

Each rank lives a bench rank's life (`harness.bench.bare_rank`) and its work is only what the
real suites need from vLLM: import it, set up its config and parallel state and build this
run's trees, through the project's own builder (`build_real`) at the configuration the run's
plan gives (`planned_spec`, the real suites' own). No pytest, rank plugin, oracle or bundle:
the ratio isolates what the harness and the suites add to vLLM's cost. Each rank writes its
tree's record (configuration, import and build seconds, peak RSS) to `OUT/rank-NN.json`, so
the bench can show the same trees were built and split the time as it does for the run.

`python -m harness.bench.bare_real_rank BACKEND TIMEOUT_S OUT` under torchrun, with the run's
rank plan in the environment (`DCPQUAL_PLAN`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from harness.atomic import atomic_write_text
from harness.bench.bare_rank import Work, run_rank
from harness.models.real import build_real, planned_spec
from harness.rank.bootstrap import RankEnv
from harness.schema.base import adapter_of
from harness.schema.plan import RankPlan
from harness.schema.rank_record import RealTreeRecord


def record_path(out: Path, rank: int) -> Path:
    return out / f"rank-{rank:02d}.json"


def read_records(out: Path) -> list[RealTreeRecord]:
    """Every rank's record of its bare build, in rank order."""
    adapter = adapter_of(RealTreeRecord)
    return [adapter.validate_json(p.read_text()) for p in sorted(out.glob("rank-*.json"))]


def build_trees(out: Path, plan: RankPlan) -> Work:
    """The work: build this rank's real trees as the real suites would, write their record."""

    def work(env: RankEnv, device: torch.device) -> None:
        tree = build_real(planned_spec(plan, env.world_size))
        text = adapter_of(RealTreeRecord).dump_json(tree.record()).decode()
        atomic_write_text(record_path(out, env.rank), text + "\n")

    return work


def main(argv: list[str]) -> int:
    backend, timeout_s, out = argv[0], float(argv[1]), Path(argv[2])
    # The plan of the run this launch stands beside; without one the defaults, as a rank's.
    plan = RankPlan.from_environ(os.environ) or RankPlan()
    return run_rank("harness.bench.bare_real_rank", backend, timeout_s, build_trees(out, plan))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
