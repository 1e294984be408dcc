"""The bare launch the full suite run is compared with: join the group, one all-reduce, leave.

Run under the same torchrun flags as `dcpqual run`, so the ratio isolates what the suites, the
rank plugin and the evidence bundle add on top of starting N Python processes with torch.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    backend = sys.argv[1] if len(sys.argv) > 1 else "gloo"
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    try:
        value = torch.ones(1, device=device)
        dist.all_reduce(value)
        if int(value.item()) != dist.get_world_size():
            print(f"bare launch: all_reduce gave {value.item()}", file=sys.stderr)
            return 1
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
