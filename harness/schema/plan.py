"""The rank plan: everything a rank needs from `dcpqual run`, serialized once.

The launcher builds one `RankPlan` per node and hands it to every rank as one JSON value in the
`DCPQUAL_PLAN` environment variable (torchrun passes the environment to its workers, the way
pytest-xdist hands a worker its `workerinput`). The rank plugin reads it once, validated, and
the suites reach it through the plugin's fixtures (`rank_plan`, `world`, `record_capture`).
Without it (a developer running torchrun by hand) every field has its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt, ValidationError

from harness.errors import UsageError
from harness.schema.base import Model, first_error
from harness.schema.signature import CommBackend

PLAN_SCHEMA: Final = "dcpqual-rank-plan/v1"
PLAN_ENV = "DCPQUAL_PLAN"

# The values the launcher accepts for the options of these names (`typing.get_args` gives them
# in this order): a rank refuses a plan that names another.
Backend = Literal["gloo", "nccl"]
ModelSource = Literal["stand-in", "real", "both", "engine", "stand-in,engine"]
RealModel = Literal["kimi-k3", "deepseek-v3"]  # the real trees suites/real builds

# The defaults both sides of a run share, defined here because the rank side may import this
# module and the launcher's run options take their defaults from here: a rank started by hand
# (no plan) runs with the same values as `dcpqual run` without flags.
# The target's parallel sizes: TP16, and DCP up to 16 (the world size where it is smaller).
TARGET_TP: Final = 16
TARGET_DCP: Final = 16
# The whole run's default time limit (`--timeout`). A rank given no per-test timeout (a plan
# written by hand: `dcpqual run` always sets one) bounds its waits for peers by it.
RUN_TIMEOUT_S: Final = 3600.0
# The per-test (and collection) time limit, at most; `dcpqual run` takes half of a shorter run.
TEST_TIMEOUT_S: Final = 300.0
# How long a rank may still finish a test a peer has failed before it is stopped.
ABORT_GRACE_S: Final = 3.0


def default_dcp(world_size: int) -> int:
    """DCP when `--dcp` is not given: the world size, at most the target's."""
    return min(world_size, TARGET_DCP)


class RankPlan(Model):
    """What every rank of one node runs with (schema "dcpqual-rank-plan/v1").

    `dcp` None means min(world size, 16), as `dcpqual run` resolves it; `test_timeout_s` and
    `collect_timeout_s` 0 mean no timeout; `maxfail` 0 never stops early."""

    schema_: Literal["dcpqual-rank-plan/v1"] = Field(default=PLAN_SCHEMA, alias="schema")
    out_dir: str | None = None  # the run's out folder (records/, junit/ go under it)
    node_index: NonNegativeInt = 0  # whose torchrun/node-KK folder holds this node's logs
    backend: Backend = "gloo"
    warm_impl: str = "vendored"
    tp: PositiveInt = TARGET_TP
    dcp: PositiveInt | None = None
    models: ModelSource = "stand-in"
    kv_cache_dtype: str = "auto"
    dcp_comm_backend: CommBackend = "ag_rs"
    real_model: RealModel = "kimi-k3"  # which real tree suites/real builds
    draft_kv_cache_dtype: str = ""  # the real draft's own KV cache dtype; "": the target's
    # The engine lane (`--models engine`): its model (None: the platform's default), the
    # `vllm serve --config` file's arguments, then `--engine-arg`/`--engine-env` KEY=VALUE.
    engine_model: Literal["deepseek-v3", "kimi-k3"] | None = None
    engine_config: dict[str, Any] = Field(default_factory=dict)
    engine_args: tuple[str, ...] = ()
    engine_env: tuple[str, ...] = ()
    test_timeout_s: NonNegativeFloat = TEST_TIMEOUT_S
    collect_timeout_s: NonNegativeFloat = TEST_TIMEOUT_S
    abort_grace_s: NonNegativeFloat = ABORT_GRACE_S
    maxfail: NonNegativeInt = 1
    fast_exit: bool = False  # end the rank with os._exit once pytest is done
    # The string-hash seed the run was asked for (`--hash-seed`, PYTHONHASHSEED, or a rerun's
    # bundle); None: the launcher drew the one every rank's PYTHONHASHSEED holds.
    hash_seed: NonNegativeInt | None = None
    # `hash_seed` was drawn all the same: a rerun's bundle's seed that its launcher drew.
    hash_seed_drawn: bool = False

    @property
    def hash_seed_was_drawn(self) -> bool:
        """Whether the launcher drew the seed in this rank's PYTHONHASHSEED (the user gave none,
        here or in the run a rerun reruns)."""
        return self.hash_seed is None or self.hash_seed_drawn

    def resolved_dcp(self, world_size: int) -> int:
        return self.dcp if self.dcp is not None else default_dcp(world_size)

    def to_environ(self) -> dict[str, str]:
        return {PLAN_ENV: self.model_dump_json(by_alias=True)}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RankPlan | None:
        """The plan this process was given, or None; a malformed one is a UsageError."""
        raw = environ.get(PLAN_ENV)
        if raw is None:
            return None
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            message = f"${PLAN_ENV} is not a {PLAN_SCHEMA}: {first_error(exc, 'plan')}"
            raise UsageError(message) from None


# A plan with every default: what the launcher's options and the run context default to.
PLAN_DEFAULTS: Final = RankPlan()
