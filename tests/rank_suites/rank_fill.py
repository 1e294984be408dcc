"""Rank 0 fills the out folder's file system up to its last few KiB (as a test writing a large
artifact would), after which the ranks' own small files still fit and the bundle does not.
With HF_TOKEN set it first leaves the token in a note in the out folder."""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist
from _world import all_reduce_sum, rank

LEAVE_FREE = int(os.environ.get("DCPQUAL_FILL_LEAVE_BYTES", str(16 << 10)))


def test_fills_the_disk(rank_plan):
    if rank() == 0:
        token = os.environ.get("HF_TOKEN")
        if token:  # a careless test's note, left before the disk fills
            notes = Path(str(rank_plan.out_dir)) / "notes"
            notes.mkdir(exist_ok=True)
            (notes / "rank-00.txt").write_text(f"HF_TOKEN={token}\n")
        ballast = Path(str(rank_plan.out_dir)) / "ballast.bin"
        stat = os.statvfs(ballast.parent)
        free = stat.f_bavail * stat.f_frsize
        with ballast.open("wb") as fh:
            fh.write(b"\0" * max(0, free - LEAVE_FREE))
    assert all_reduce_sum(1.0) == dist.get_world_size()
