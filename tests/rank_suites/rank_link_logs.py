"""Every test passes, but rank 0 makes `logs`, where the launcher copies the ranks' logs once
they have run, a link to a folder outside the out folder (`DCPQUAL_OUTSIDE_DIR`)."""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist
from _world import all_reduce_sum, rank


def test_links_the_logs_folder_outside(rank_plan):
    if rank() == 0:
        out = Path(str(rank_plan.out_dir))
        outside = Path(os.environ["DCPQUAL_OUTSIDE_DIR"])
        (out / "logs").symlink_to(outside, target_is_directory=True)
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_after():
    dist.barrier()
