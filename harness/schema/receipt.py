"""The receipt (`receipt.json`, schema "dcpqual-receipt/v1") as pydantic models.

The field names of v1 as first written are the contract and are kept exactly; fields marked
"extension" below were added since (extending is allowed, renaming is not). Models are frozen
and forbid unknown keys at every level (no free-form dicts), so `dcpqual verify` rejects a
receipt that was edited to say more than the writer wrote, and `schemas/receipt.json` describes
it exactly.
Values are validated where they are born: geometry and digests check themselves.

`limitations` stays a list of "key: text" lines (the v1 form, which every reader reads);
`limitation_items` (extension) holds the same limitations as `{key, text}` objects, and must
render to exactly those lines, so a tool can match keys without parsing text.
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    model_validator,
)

from harness.core.signature import TransportSignature
from harness.schema.base import Limitation, Model, is_sha256
from harness.schema.image import Image
from harness.schema.launch import Interruption, Launch, NodeState
from harness.schema.rank_record import RealTree
from harness.schema.smoke import Smoke

SCHEMA: Final = "dcpqual-receipt/v1"

Verdict = Literal["pass", "fail"]
Status = Literal["qualified", "source-qualified", "not-qualified"]
Backend = Literal["gloo", "nccl"]


class Geometry(Model):
    """The parallel geometry qualified; one receipt is about one geometry."""

    world_size: PositiveInt
    nnodes: PositiveInt
    nproc_per_node: PositiveInt
    backend: Backend
    tp: PositiveInt
    dcp: PositiveInt

    @model_validator(mode="after")
    def _consistent(self) -> Geometry:
        if self.world_size != self.nnodes * self.nproc_per_node:
            raise ValueError(
                f"world_size={self.world_size} != nnodes={self.nnodes} x "
                f"nproc_per_node={self.nproc_per_node}"
            )
        if self.tp % self.dcp:
            raise ValueError(f"dcp={self.dcp} does not divide tp={self.tp}")
        return self


class Gpu(Model):
    index: NonNegativeInt
    name: str
    uuid: str | None = None
    memory_total_mib: NonNegativeInt | None = None


class Environment(Model):
    """Where the run happened. `env` holds only NCCL_/VLLM_/B12X_/TORCH_/CUDA_ variables,
    with secret-looking ones (names in `redacted`) replaced by "<redacted>"."""

    torch: str
    cuda: str | None  # torch.version.cuda; None for a CPU build
    nccl: str | None
    device_names: list[str]  # one per visible GPU, or ["cpu"]
    python: str
    host: str  # host-<16 hex of sha256(hostname)>: never the name itself
    # extensions
    hosts: list[str] = Field(default_factory=list)  # the rank records' hosts, as `host` says them
    platform: str = ""
    cpu_count: NonNegativeInt | None = None
    # The CPU's AMX and AVX-512 features (`/proc/cpuinfo`): vLLM's CPU platform picks its MLA
    # kernels and the scheduler's token budget by them, so a CPU run's trees differ by host.
    cpu_features: list[str] = Field(default_factory=list)
    torch_git: str | None = None
    cuda_available: bool = False
    driver: str | None = None
    gpus: list[Gpu] = Field(default_factory=list)
    nvml: bool = False  # GPU facts came from nvidia-ml-py
    env: dict[str, str] = Field(default_factory=dict)
    redacted: list[str] = Field(default_factory=list)


class Source(Model):
    """One component's identity: commit and git tree (never a branch), or a package version."""

    version: str | None = None
    commit: str | None = None
    tree: str | None = None
    dirty: bool | None = None
    dirty_paths: list[str] = Field(default_factory=list)  # first few, for a reviewer


class Tally(Model):
    """Outcomes of one suite, counted per test over all ranks (see harness.evidence.junit)."""

    passed: NonNegativeInt = 0
    failed: NonNegativeInt = 0
    skipped: NonNegativeInt = 0
    errors: NonNegativeInt = 0
    rank_cases: NonNegativeInt = 0  # extension: testcases in junit/merged.xml, all ranks


class SignatureRow(Model):
    """One transport signature of one model, merged over ranks (see harness.evidence.collect)."""

    model: str
    total_heads: PositiveInt
    query_head_dim: PositiveInt
    output_head_dim: PositiveInt
    dtype: str
    warmed: bool
    used_in_capture: bool
    # extensions
    dcp_world_size: PositiveInt = 1
    max_tokens: PositiveInt = 1
    device_type: str = "cpu"
    ranks: list[NonNegativeInt] = Field(default_factory=list)  # ranks that reported it
    consistent: bool = True  # every reporting rank said the same warmed/used
    query_dtype: str | None = None  # None in receipts written before it: the same as dtype
    comm_backend: str = "ag_rs"

    def transport_signature(self) -> TransportSignature:
        """The signature this row is about (GeometryError/UsageError if the row cannot be one)."""
        return TransportSignature(
            dtype=self.dtype,
            total_heads=self.total_heads,
            query_head_dim=self.query_head_dim,
            output_head_dim=self.output_head_dim,
            dcp_world_size=self.dcp_world_size,
            max_tokens=self.max_tokens,
            device_type=self.device_type,
            query_dtype=self.query_dtype,
            comm_backend=self.comm_backend,
        )


class CaptureEvent(Model):
    rank: NonNegativeInt
    test: str
    detector: str
    what: str
    signature: str | None = None
    phase: str = "capture"  # "warmup" iterations of the window, or the "capture" itself


class Capture(Model):
    """Lazy work seen in capture windows, negative-control windows excluded."""

    lazy_events: NonNegativeInt
    by_detector: dict[str, NonNegativeInt]
    per_rank: dict[int, NonNegativeInt]
    # extensions
    windows: NonNegativeInt = 0
    paths: dict[str, NonNegativeInt] = Field(default_factory=dict)  # cuda-graph | cpu-simulated
    events: list[CaptureEvent] = Field(default_factory=list)
    replays: NonNegativeInt = 0  # replays with fresh inputs that matched eager results
    # Detectors that did not watch at least one window here, with the reason (inactive there, or
    # missing from its list while the run's records list them: `collect.unwatched`): their
    # silence proves nothing, so each is named in `limitations`.
    inactive_detectors: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _sums(self) -> Capture:
        for name, total in (
            ("by_detector", sum(self.by_detector.values())),
            ("per_rank", sum(self.per_rank.values())),
            ("events", len(self.events)),
        ):
            if total != self.lazy_events:
                raise ValueError(f"lazy_events={self.lazy_events} but {name} adds up to {total}")
        paths = sum(self.paths.values())
        if paths != self.windows:
            raise ValueError(f"windows={self.windows} but paths add up to {paths}")
        return self


class NegativeControl(Model):
    """Windows that provoke lazy work on purpose: each must be seen by its expected detectors."""

    expected: NonNegativeInt  # negative-control windows run
    detected: NonNegativeInt  # of those, windows where every expected detector fired
    lazy_events: NonNegativeInt
    # extensions
    by_detector: dict[str, NonNegativeInt] = Field(default_factory=dict)
    missed: list[str] = Field(default_factory=list)  # "rank N: test" of windows not detected

    @model_validator(mode="after")
    def _counts(self) -> NegativeControl:
        if self.detected > self.expected:
            raise ValueError(f"detected={self.detected} > expected={self.expected}")
        if len(self.missed) != self.expected - self.detected:
            raise ValueError(
                f"{len(self.missed)} missed windows listed, expected - detected = "
                f"{self.expected - self.detected}"
            )
        return self


RootCauseKind = Literal[
    "broke-world",
    "test",
    "killed",
    "lazy-event",
    "negative-control",
    "signature",
    "no-outcome",
    "torchrun",
    "junit",
    "run",
    "interrupted",
    "node-gone",
]


class RootCause(Model):
    rank: NonNegativeInt | None
    test: str | None
    message: str
    kind: RootCauseKind = "test"  # extension: where the cause was found


class FailedTest(Model):
    """extension: one failed test as a pytest user reads it: node id, the ranks whose own
    failure it was, and the first line of the first of their messages."""

    nodeid: str
    outcome: Literal["failed", "error"]
    ranks: list[NonNegativeInt] = Field(default_factory=list)
    message: str = ""


class Ranks(Model):
    """extension: which ranks left what. A killed rank left no record or an incomplete one;
    `stopped` names the killed ranks whose record says another rank's fault (or torchrun
    stopping the job) ended them, so a reader can tell the cause from its consequences."""

    expected: PositiveInt
    reported: NonNegativeInt
    complete: NonNegativeInt
    killed: list[NonNegativeInt] = Field(default_factory=list)
    stopped: list[NonNegativeInt] = Field(default_factory=list)
    missing_junit: list[NonNegativeInt] = Field(default_factory=list)

    @model_validator(mode="after")
    def _counts(self) -> Ranks:
        if not self.complete <= self.reported <= self.expected:
            raise ValueError(
                f"need complete <= reported <= expected, got {self.complete}, "
                f"{self.reported}, {self.expected}"
            )
        if len(self.killed) != self.expected - self.complete:
            raise ValueError(
                f"{len(self.killed)} killed ranks listed, expected - complete = "
                f"{self.expected - self.complete}"
            )
        if not set(self.stopped) <= set(self.killed):
            raise ValueError(f"stopped ranks {self.stopped} are not all killed {self.killed}")
        return self


class HashSeed(Model):
    """extension: a string-hash seed (PYTHONHASHSEED) and the ranks of one node that started
    with it, from their records. The launcher gives every rank of its node one seed (ranks
    forked from one preloaded interpreter can only share its seed, so cold ones get it too);
    `drawn`: it drew the seed, where ranks torchrun starts itself would each draw their own.
    `dcpqual run --hash-seed SEED` starts ranks with it again."""

    node: NonNegativeInt
    seed: NonNegativeInt
    drawn: bool
    ranks: list[NonNegativeInt]


class Coverage(Model):
    """extension: what the ranks selected against what they ran, from their records.

    A test a rank collected but never reported an outcome for did not run there (its session
    ended early, e.g. `pytest.exit`), so a run is only as good as the tests that have outcomes.
    """

    collected: NonNegativeInt = 0  # distinct test ids any reporting rank selected
    without_outcome: NonNegativeInt = 0  # (rank, test) pairs collected with no outcome
    first_without_outcome: str | None = None  # "rank N: <test id>", earliest in test order
    # A skip proves nothing: tests that skipped on every rank that reported them, and tests
    # that ran on some ranks and skipped on others (a sub-world case another lane ran is not a
    # skip). The first of each is named in test order; "<test id>" or "<test id> (skipped on
    # ranks [..], ran on ranks [..])".
    skipped_everywhere: NonNegativeInt = 0
    first_skipped_everywhere: str | None = None
    skipped_on_some_ranks: NonNegativeInt = 0
    first_skipped_on_some_ranks: str | None = None
    # Tests pytest ran no call phase for on some rank (--setup-only, --setup-plan, a hook):
    # their bodies never ran there, so they are skips, and the run fails.
    no_body: NonNegativeInt = 0
    first_no_body: str | None = None

    @model_validator(mode="after")
    def _first(self) -> Coverage:
        for count, first in (
            ("without_outcome", "first_without_outcome"),
            ("skipped_everywhere", "first_skipped_everywhere"),
            ("skipped_on_some_ranks", "first_skipped_on_some_ranks"),
            ("no_body", "first_no_body"),
        ):
            if (getattr(self, first) is None) != (getattr(self, count) == 0):
                raise ValueError(
                    f"{count}={getattr(self, count)} but {first} is {getattr(self, first)!r}"
                )
        return self


class Selection(Model):
    """extension: what the ranks' pytest was told to select, from their records: the targets,
    those that are not the whole suites/ folder, the most collected tests any rank's -k, -m or
    --deselect took away, and the --ignore paths. Any of these narrows the run
    (`rules.narrowing`): a limitation, and never `qualified`."""

    targets: list[str] = Field(default_factory=list)
    partial_targets: list[str] = Field(default_factory=list)
    deselected: NonNegativeInt = 0
    ignored: list[str] = Field(default_factory=list)
    # What was collected against the harness's own suites/ (see the rank record's Selection).
    unreached: list[str] = Field(default_factory=list)
    outside: list[str] = Field(default_factory=list)
    removed: NonNegativeInt = 0
    rules: list[str] = Field(default_factory=list)


class RequestedCount(Model):
    requested: str  # what was typed: auto | cpu | gpu | N
    resolved: PositiveInt


class ChosenOptions(Model):
    """The run's options a rerun or a reader needs that geometry does not say."""

    nproc_per_node: RequestedCount
    maxfail: NonNegativeInt = 1
    tee: list[NonNegativeInt] = Field(default_factory=list)
    test_timeout_s: float | None = None
    timeout_s: float | None = None
    rerun_of: str | None = None


class Scrub(Model):
    """Files the launcher scrubbed of secrets before the writer ran, and names it renamed.

    `in_place`: of the scrubbed files, those rewritten where they were because an atomic
    rewrite failed (a full disk); `removed`: files that could not be scrubbed at all and were
    removed, so the bundle lacks them (the run fails, naming them).
    """

    changed: list[str] = Field(default_factory=list)
    renamed: list[tuple[str, str]] = Field(default_factory=list)
    in_place: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)


class Stray(Model):
    """Something the run left in the out folder that is not evidence, set aside before the
    bundle (never followed or read): where it was, what it was, what was done with it."""

    path: str
    kind: str  # "symlink" | "fifo" | "socket" | "device" | "file" | "folder"
    action: str  # "removed" | "moved to strays/..."


class NodeZeroGone(Model):
    """extension: node 0 of a multi-node run ended without writing the bundle (no receipt
    within `waited_s` seconds of node `by_node`'s torchrun exiting, and node 0's marker never
    said finished); node `by_node` wrote it from what the shared folder held, and the run's
    `launch` is that node's."""

    waited_s: NonNegativeFloat
    by_node: PositiveInt


class RunExtra(Model):
    """What the launcher (or the smoke) adds about the run; each part only where it applies."""

    launch: Launch | None = None
    options: ChosenOptions | None = None
    nodes: dict[str, NodeState | None] | None = None
    scrub: Scrub | None = None
    strays: list[Stray] = Field(default_factory=list)
    smoke: Smoke | None = None
    node_zero_gone: NodeZeroGone | None = None

    @property
    def interrupted(self) -> Interruption | None:
        return None if self.launch is None else self.launch.interrupted


class Run(Model):
    """extension: how the run was launched and how it ended."""

    command: list[str] = Field(default_factory=list)
    pytest_args: list[str] = Field(default_factory=list)
    exit_code: int = 0
    timed_out: bool = False
    started_at: str = ""
    finished_at: str = ""
    extra: RunExtra = Field(default_factory=RunExtra)  # the launcher's RunContext.extra
    rootdir: str | None = None  # the ranks' pytest rootdir: node ids are relative to it


class EngineLane(Model):
    """extension: the engine lane (vLLM's own engine on every rank), as its records state it.

    `engines`: each distinct engine configuration the ranks built (identity, arguments and
    environment, policy); `warm_ran`/`capture_ran`: every engine rank ran vLLM's own warm /
    capture phase; `lazy_events`: things created in capture or decode outside the negative
    controls; `controls`/`controls_caught`: the lazy-phase controls and how many were caught;
    `controls_false`: before-capture controls wrongly called lazy; `b12x_calls`: DCP calls b12x
    objects served, per phase; `other_calls`: DCP calls that took another path;
    `tokens_agree`: every rank generated the same tokens; `eager_equal`: each rank's tokens
    equal its `enforce_eager` engine's."""

    ranks: list[NonNegativeInt] = Field(default_factory=list)
    engines: list[dict[str, Any]] = Field(default_factory=list)
    phases_s_max: dict[str, NonNegativeFloat] = Field(default_factory=dict)
    warm_ran: bool = False
    capture_ran: bool = False
    lazy_events: NonNegativeInt = 0
    controls: NonNegativeInt = 0
    controls_caught: NonNegativeInt = 0
    controls_false: NonNegativeInt = 0
    b12x_calls: dict[str, NonNegativeInt] = Field(default_factory=dict)
    other_calls: NonNegativeInt = 0
    tokens_agree: bool = False
    eager_equal: bool = False
    build_s_max: NonNegativeFloat = 0.0
    peak_rss_mib_max: NonNegativeFloat = 0.0
    limitations: list[Limitation] = Field(default_factory=list)


class Models(Model):
    """extension: which model trees the ranks built from vLLM's own classes, and the engine
    lane's engines (None: the lane did not run)."""

    real: list[str] = Field(default_factory=list)
    trees: list[RealTree] = Field(default_factory=list)  # one per distinct configuration
    # Per rank: the build plus what it imported of vLLM itself. A rank forked from a forkserver
    # that preloaded vLLM paid no import here: the server paid it once (its line on the agent's
    # log).
    build_s_max: NonNegativeFloat = 0.0
    peak_rss_mib_max: NonNegativeFloat = 0.0
    ranks_with_real_trees: list[NonNegativeInt] = Field(default_factory=list)
    engine: EngineLane | None = None


class Receipt(Model):
    schema_: Literal["dcpqual-receipt/v1"] = Field(alias="schema")
    verdict: Verdict
    status: Status
    geometry: Geometry
    environment: Environment
    image: Image | None
    sources: dict[str, Source]
    suites: dict[str, Tally]
    signatures: list[SignatureRow]
    capture: Capture
    negative_control: NegativeControl
    root_cause: RootCause | None
    limitations: list[str]  # "key: text" lines
    # extensions
    failures: list[str] = Field(default_factory=list)  # every reason the verdict is fail
    warm_impl: str = "vendored"
    transports: list[str] = Field(default_factory=list)  # transport backends ranks reported
    models: Models = Field(default_factory=Models)  # real vLLM trees built (collect)
    ranks: Ranks
    # None only in receipts written before coverage was recorded; verify re-derives it and
    # refuses a receipt without it.
    coverage: Coverage | None = None
    run: Run = Field(default_factory=Run)
    generated_by: str = ""
    created_at: str = ""
    scrubbed_files: list[str] = Field(default_factory=list)  # files a secret was removed from
    # sha256 of every bundle file except receipt.json, summary.md and SHA256SUMS: a second
    # witness, so that verify can tell an edited file from an edited SHA256SUMS line.
    files: dict[str, str] = Field(default_factory=dict)
    # The failed tests, the root cause's first, then in collection order: the ending's FAILED
    # lines and what `dcpqual run --rerun-failed` reruns.
    failed_tests: list[FailedTest] = Field(default_factory=list)
    # None where the records do not say what was selected (written before they did).
    selection: Selection | None = None
    # The tests the tallies count as skipped, by reason ({reason: tests}, most first), from
    # junit/merged.xml; None in receipts written before them.
    skip_reasons: dict[str, NonNegativeInt] | None = None
    # The limitations as {key, text} objects, rendering to exactly `limitations`; None in
    # receipts written before them (their keys are then read from the lines).
    limitation_items: list[Limitation] | None = None
    # The ranks' string-hash seeds, one per node and seed; None in receipts whose records do
    # not say (written before the launcher fixed one).
    hash_seeds: list[HashSeed] | None = None

    @model_validator(mode="after")
    def _files(self) -> Receipt:
        bad = sorted(rel for rel, digest in self.files.items() if not is_sha256(digest))
        if bad:
            raise ValueError(f"files entries that are not sha256 hex digests: {bad}")
        return self

    @model_validator(mode="after")
    def _items(self) -> Receipt:
        if self.limitation_items is not None:
            lines = [item.line() for item in self.limitation_items]
            if lines != self.limitations:
                raise ValueError(
                    "limitation_items do not render to limitations: "
                    f"{len(lines)} items, {len(self.limitations)} lines"
                )
        return self

    def limitation_keys(self) -> list[str]:
        """The keys of the limitations, from the objects or, in older receipts, the lines."""
        if self.limitation_items is not None:
            return [item.key for item in self.limitation_items]
        return [line.partition(": ")[0] for line in self.limitations if ": " in line]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Receipt:
        return cls.model_validate(data)

    def dumps(self) -> str:
        """The exact text of receipt.json (stable key order, trailing newline)."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
