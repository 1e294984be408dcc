"""What the launcher knows about a finished run, handed to the evidence writer.

The contract between `harness.launch` (which launched torchrun) and `harness.evidence` (which turns
the out folder into a bundle). Everything else the writer reads from the folder itself:
`records/rank-NN.json`, `junit/rank-NN.xml`, `torchrun/` logs and error files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunContext:
    world_size: int
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    backend: str = "gloo"  # gloo | nccl
    tp: int = 16
    dcp: int = 16
    warm_impl: str = "vendored"
    command: tuple[str, ...] = ()  # the torchrun argv, as launched
    pytest_args: tuple[str, ...] = ()
    exit_code: int = 0  # torchrun's exit status
    timed_out: bool = False  # the whole run hit --timeout and was killed
    started_at: str = ""
    finished_at: str = ""
    # Root cause torchrun itself reported (from TORCHELASTIC_ERROR_FILE), if any:
    # {"rank": int, "message": str, "timestamp": ...}
    torchrun_error: dict[str, Any] | None = None
    image: dict[str, Any] | None = None  # identity of the source-locked image, or None
    extra: dict[str, Any] = field(default_factory=dict)
    # {key: text} for paths this run itself knows did not run (the one-GPU smoke's world 1),
    # added to the receipt's `limitations` after the ones the rules derive.
    limitations: dict[str, str] = field(default_factory=dict)
