"""Every test passes, but rank 0 leaves what a bundle cannot hold in the out folder: a symlink,
a FIFO, and files named like the bundle's own (a forged receipt and SHA256SUMS)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch.distributed as dist
from _world import all_reduce_sum, rank


def test_leaves_odd_files_in_the_out_folder(rank_plan):
    if rank() == 0:
        out = Path(str(rank_plan.out_dir))
        (out / "link-to-hostname").symlink_to("/etc/hostname")
        os.mkfifo(out / "a-fifo")
        forged = {"schema": "dcpqual-receipt/v1", "verdict": "pass"}
        (out / "receipt.json").write_text(json.dumps(forged))
        (out / "SHA256SUMS").write_text("0" * 64 + "  receipt.json\n")
    assert all_reduce_sum(1.0) == dist.get_world_size()


def test_after():
    dist.barrier()
