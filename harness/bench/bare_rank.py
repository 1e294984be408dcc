"""The bare launch a full suite run is compared with: join the group, one all-reduce, leave.

Run under `dcpqual run`'s torchrun flags and the same bootstrap as the rank plugin, so the ratio
isolates what the suites, the rank plugin and the evidence bundle add to starting N processes.
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from harness.rank.bootstrap import RankEnv, init_process_group, teardown


def main(backend: str) -> int:
    env = RankEnv.from_env()
    device = init_process_group(backend, env, timedelta(minutes=10))
    try:
        value = torch.ones(1, device=device)
        dist.all_reduce(value)
        if int(value.item()) != env.world_size:
            print(f"bare launch: all_reduce gave {value.item()}", file=sys.stderr)
            return 1
        dist.barrier()
    finally:
        teardown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "gloo"))
