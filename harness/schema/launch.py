"""What the launcher writes about its own launch: each node's marker in a multi-node run's shared
out folder (`nodes/node-KK.json`, schema "dcpqual-node-marker/v1") and how its torchrun ended.

The launcher builds these values and the receipt carries the same ones (`run.extra.launch`,
`run.extra.nodes`), so there is one shape per value from the launch to the receipt.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt

from harness.schema.base import Model

NodeStateName = Literal["started", "finished"]


# The ranks' string-hash seeds (PYTHONHASHSEED), as bundles written by the launcher's earlier
# fork server (its "zygote") state them: "shared-random", forked ranks share the one random seed
# the zygote drew, where ranks torchrun starts itself would each draw their own;
# "per-rank-random", each rank drew its own (it was not forked); "fixed", PYTHONHASHSEED set, the
# same in every rank under either launch. The launcher now fixes one for every rank of its node
# (the ranks record it, the receipt's `hash_seeds` states it): the other two modes are in bundles
# written before it did.
HashSeedMode = Literal["shared-random", "per-rank-random", "fixed"]


class ZygoteState(Model):
    """How this node's ranks started, in bundles written by the launcher's earlier fork server:
    forked from one zygote that had imported torch, pytest and the harness, each behind a fork
    stub torchrun started, or, where the zygote refused to fork, started cold by their stubs as
    torchrun would have. The launcher now starts ranks through torchelastic's agent and writes
    none (each rank's record says how it started)."""

    pid: NonNegativeInt = 0
    ready: bool = False  # it said it was ready (its preload done) in its log
    exit_code: int | None = None  # how it ended; None: still running when the launch ended
    # Why the launch failed because of it: it could not start, or died before torchrun exited.
    error: str | None = None
    used: bool = False  # at least one rank was forked from it
    forked: NonNegativeInt = 0  # ranks it forked
    not_used: str | None = None  # why no rank was forked (the zygote's refusal)
    # Ranks it did not fork because a forked one would have differed from its cold start (its
    # interpreter's options, flags or sys.path; CUDA started): their stubs started them cold.
    sent_cold: NonNegativeInt = 0
    sent_cold_why: str | None = None  # the first of those reasons
    hash_seed: HashSeedMode = "shared-random"


# Each node writes its marker "started" before its torchrun and "finished" with torchrun's exit
# status after (`harness.launch.nodes`); the receipt keeps every node's last marker. (Docstrings
# of receipt models are descriptions in the committed receipt schema.)
class NodeState(Model):
    """One node's marker in a multi-node run's shared out folder."""

    node_rank: NonNegativeInt
    nnodes: PositiveInt
    rdzv_endpoint: str
    state: NodeStateName
    hostname: str = ""
    pid: NonNegativeInt = 0
    exit_code: int | None = None
    timed_out: bool = False
    started_at: str = ""
    finished_at: str = ""
    # How this node's ranks started, in bundles of the earlier fork server (its launch's zygote;
    # None otherwise): a receipt speaks for other nodes' zygotes only so.
    zygote: ZygoteState | None = None
    # Pids its launcher ended after its torchrun exited (`Launch.leftovers`): a receipt knows
    # another node's leftovers only so.
    leftovers: list[int] = Field(default_factory=list)


class Interruption(Model):
    """The launcher was interrupted: by which signal, when, and how far into the run."""

    signal: str  # "SIGINT" | "SIGTERM"
    at: str  # UTC, ISO 8601
    after_s: float
    exit_code: int  # what `dcpqual run` exits with: 128 + the signal number
    tests_done: NonNegativeInt = 0  # tests every reporting rank had finished at the signal
    tests_collected: NonNegativeInt = 0
    running: str | None = None  # a test running then

    def message(self) -> str:
        """How an interrupted run is named: the signal, when, and how far the tests had got."""
        return (
            f"the run was interrupted by {self.signal} at {self.at}, after {self.after_s}s, "
            f"with {self.tests_done} of {self.tests_collected} collected tests finished on "
            f"every rank" + (f" and {self.running} running" if self.running else "")
        )


class Launch(Model):
    """How this node's torchrun ended (`harness.launch.launcher.launch`)."""

    exit_code: int = 0
    timed_out: bool = False
    started_at: str = ""
    finished_at: str = ""
    elapsed_s: NonNegativeFloat = 0.0
    leftovers: list[int] = Field(default_factory=list)  # pids ended after torchrun exited
    interrupted: Interruption | None = None
    # Ranks whose process left mid-suite, for which the launcher ended the tree.
    ended_for_ranks_gone_mid_suite: list[NonNegativeInt] = Field(default_factory=list)
    # The earlier fork server's state, in bundles it wrote; None now (the ranks' records say
    # how each started).
    zygote: ZygoteState | None = None
