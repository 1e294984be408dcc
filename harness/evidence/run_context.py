"""What the launcher knows about a finished run, handed to the evidence writer.

The contract between `harness.launch` (which launched torchrun) and `harness.evidence` (which turns
the out folder into a bundle), in typed values only. Everything else the writer reads from the
folder itself: `records/rank-NN.json`, `junit/rank-NN.xml`, `torchrun/` logs and error files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.schema.image import Image
from harness.schema.plan import PLAN_DEFAULTS, TARGET_DCP
from harness.schema.receipt import RunExtra


@dataclass(frozen=True)
class TorchrunFailure:
    """The root cause torchrun itself reported (one TORCHELASTIC_ERROR_FILE): the failed rank
    (None when the file does not say), its message, when, and the file, relative to the out
    folder."""

    rank: int | None
    message: str
    time: float = 0.0
    file: str = ""

    def cause(self) -> tuple[int | None, str]:
        """(rank, message naming the file) for the receipt's root cause; a negative rank is
        no rank."""
        rank = None if self.rank is None or self.rank < 0 else self.rank
        return rank, f"{self.message} ({self.file})" if self.file else self.message


@dataclass(frozen=True)
class RunContext:
    """The run as launched. A field named like one of `dcpqual run`'s options holds that
    option's value (`dcp` resolved); its default is the rank plan's, which a run without the
    flag also gets."""

    world_size: int
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    backend: str = PLAN_DEFAULTS.backend  # gloo | nccl
    tp: int = PLAN_DEFAULTS.tp
    dcp: int = TARGET_DCP
    warm_impl: str = PLAN_DEFAULTS.warm_impl
    command: tuple[str, ...] = ()  # the torchrun argv, as launched
    pytest_args: tuple[str, ...] = ()  # the targets the ranks' pytest was given
    exit_code: int = 0  # torchrun's exit status
    timed_out: bool = False  # the whole run hit --timeout and was killed
    started_at: str = ""
    finished_at: str = ""
    torchrun_error: TorchrunFailure | None = None  # the earliest error file, if any
    image: Image | None = None  # identity of the source-locked image, or None
    extra: RunExtra = field(default_factory=RunExtra)
    # {key: text} for paths this run itself knows did not run (the one-GPU smoke's world 1),
    # added to the receipt's `limitations` after the ones the rules derive.
    limitations: dict[str, str] = field(default_factory=dict)
