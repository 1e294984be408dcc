"""`dcpqual signatures --source real`: discovery over vLLM's real tree at the asked geometry.

vLLM builds tp=T only on a world of T ranks, so this spawns T local gloo processes; each builds
the real tree (target + MTP draft) and runs the chosen recognizers over the target and the
static forward context, and rank 0 hands its rows back through a file. About 0.9 GiB and 30 s
of CPU per rank: `--tp 16` needs a machine that fits 16 of them.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness.core.peers import VLLM_REQUIREMENT, vllm_installed
from harness.errors import UsageError
from harness.schema.signature import SignatureList, SignatureListRow

ROWS = "rows.json"  # rank 0's rows, as `dcpqual signatures --json` prints them


@dataclass(frozen=True)
class Request:
    model: str
    tp: int
    dcp: int
    recognizers: str
    kv_cache_dtype: str = "auto"
    dcp_comm_backend: str = "ag_rs"


def _rank(rank: int, request: Request, folder: str) -> None:
    import torch.distributed as dist

    from harness.models.cli import signature_rows
    from harness.models.real.builder import RealSpec, build_real
    from harness.warm.discovery import discover
    from harness.warm.recognizers import WarmContext, recognizer_set

    dist.init_process_group(
        "gloo",
        init_method=f"file://{folder}/store",
        rank=rank,
        world_size=request.tp,
        timeout=timedelta(seconds=300),
    )
    try:
        spec = RealSpec(
            request.model,
            tp=request.tp,
            dcp=request.dcp,
            kv_cache_dtype=request.kv_cache_dtype,
            dcp_comm_backend=request.dcp_comm_backend,
        )
        tree = build_real(spec)
        config: Any = tree.vllm_config
        context = WarmContext(
            dtype="bf16",
            max_tokens=config.scheduler_config.max_num_batched_tokens,
            dcp_world_size=request.dcp,
        )
        found = discover(
            tree.target,
            context=context,
            recognizers=recognizer_set(request.recognizers),
            static_forward_context=tree.static_forward_context,
        )
        if rank == 0:
            rows = signature_rows(request.model, found, source="real")
            Path(folder, ROWS).write_text(SignatureList(rows).dumps())
    finally:
        dist.destroy_process_group()


def real_signature_rows(request: Request) -> list[SignatureListRow]:
    """Spawn `request.tp` gloo ranks, build the real tree on each, return rank 0's rows."""
    if not vllm_installed():
        raise UsageError(f"--source real needs {VLLM_REQUIREMENT}")
    if request.tp < 1 or request.dcp < 1 or request.tp % request.dcp:
        raise UsageError(f"dcp={request.dcp} must divide tp={request.tp}")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        os.environ.pop("VLLM_DIST_IDENT", None)  # one identity per rank (see the shims)
        mp.spawn(_rank, args=(request, folder), nprocs=request.tp, join=True)
        return SignatureList.model_validate_json(Path(folder, ROWS).read_bytes()).root
