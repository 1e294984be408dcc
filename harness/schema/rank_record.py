"""The per-rank record (`records/rank-NN.json`): the contract between a rank and the bundle.

The rank plugin fills it while pytest runs; the evidence writer reads it after torchrun exits.
Every value is a pydantic dataclass: positional like a frozen dataclass, validated on
construction and on reading, unknown keys refused, described by `schemas/rank-record.json`.
Rank-side code must stay importable without the evidence or launcher packages (and without
torch: nothing here imports it).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, Literal, Self

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass

from harness.atomic import atomic_write_text
from harness.gitinfo import DIRTY_PATHS_SHOWN, GitIdentity
from harness.jsonfile import read_json
from harness.schema.base import JsonValue, Limitation, derived_field
from harness.schema.capture import STRICT, CaptureRecord, derived
from harness.schema.layout import JUNIT_DIR, STACKS_DIR, rank_file_name

RANK_RECORD_SCHEMA: Final = "dcpqual-rank-record/v1"

Outcome = Literal["passed", "failed", "skipped", "error"]
OUTCOMES: tuple[Outcome, ...] = ("passed", "failed", "skipped", "error")
WorldBreakAction = Literal["destroyed-process-group", "signalled-agent"]
WORLD_BREAK_ACTIONS: tuple[WorldBreakAction, ...] = ("destroyed-process-group", "signalled-agent")


def suite_of(nodeid: str) -> str:
    """Suite of a test id: its folder under suites/ ('suites/capture/test_x.py::t' -> 'capture')."""
    parts = nodeid.split("::", 1)[0].replace("\\", "/").split("/")
    if "suites" in parts:
        idx = parts.index("suites")
        if idx + 2 < len(parts):
            return parts[idx + 1]
    return parts[-2] if len(parts) >= 2 else "tests"


# The message of a sub-world case that another lane ran (`harness.rank.subworld`), recorded
# here as a skip that is not a skip of the test (`TestOutcome.elsewhere` says so).
ELSEWHERE_SKIP = "sub-world case placed on "
# The message of a test pytest ran no call phase for (`TestOutcome.no_body`).
NO_BODY_SKIP = (
    "no test body ran: pytest skipped the call phase (--setup-only, --setup-plan or a hook)"
)


@dataclass(frozen=True, config=STRICT)
class TestOutcome(JsonValue):
    """One test's agreed outcome as seen from one rank.

    `primary` is False when this rank failed only because a peer failed first (a follow-on
    error); `failing_ranks` lists the ranks whose own failure was primary, agreed by collective.
    `failed_at`: when this rank saw its own failure (unix time); `agreed`: whether the outcome is
    the ranks' agreed one (False: the rank stopped before agreement).
    """

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: Outcome
    duration_s: float = 0.0
    message: str | None = None
    primary: bool = True
    failing_ranks: tuple[NonNegativeInt, ...] = ()
    failed_at: float | None = None
    agreed: bool = True
    # A sub-world case another lane ran, recorded here as a skip by the harness itself (never
    # by a test: a test's own skip with any message is a skip).
    elsewhere: bool = False
    # pytest ran no call phase for it on this rank (--setup-only, --setup-plan, a hook): its
    # body never ran, so it is recorded as a skip that says so, never as passed.
    no_body: bool = False

    @derived_field
    def suite(self) -> str:
        return suite_of(self.nodeid)

    @property
    def ran_elsewhere(self) -> bool:
        """A sub-world case that another lane ran, recorded here as a skip."""
        return self.outcome == "skipped" and self.elsewhere

    @field_validator("duration_s")
    @classmethod
    def _rounded(cls, value: float) -> float:
        return round(value, 6)

    @model_validator(mode="after")
    def _bodiless_skipped(self) -> TestOutcome:
        if self.no_body and self.outcome != "skipped":
            raise ValueError(f"a test whose body never ran cannot be {self.outcome!r}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        if isinstance(data, dict) and "suite" in data:
            data = derived(data, "suite", suite_of(str(data.get("nodeid", ""))), "test outcome")
        return data


@dataclass(frozen=True, config=STRICT)
class WorldBreak(JsonValue):
    """This rank's own action broke the world for every rank: it destroyed its default process
    group, or sent a signal to its torchrun agent (or the agent's process group). Recorded when
    it happened, so the rank that did it is the root cause, not the peers that suffered it.
    `signal` and `target` (a pid, negative for a process group) only for a signal."""

    action: WorldBreakAction
    test: str | None
    at: float
    message: str
    signal: str | None = None
    target: int | None = None


@dataclass(frozen=True, config=STRICT)
class ErrorNote(JsonValue):
    """What a rank adds to torchrun's per-worker error file (`extraInfo.dcpqual`) when it fails
    first: its global rank, the test (None: outside a test), the message and when. torchrun's
    own fields say none of this by rank, so the launcher reads the root cause from here."""

    rank: NonNegativeInt
    test: str | None
    message: str
    time: float


def error_file_note(path: Path) -> ErrorNote | None:
    """The note a rank of the harness left in torchrun's error file at `path`
    (`message.extraInfo.dcpqual`); None when there is no such file or it is not the rank's own
    (a child the rank started inherits TORCHELASTIC_ERROR_FILE and may write torch's format)."""
    try:
        return note_in(read_json(path))
    except (OSError, ValueError):
        return None


def note_in(error_file: object) -> ErrorNote | None:
    """The rank's own note in torchrun's error file, already parsed (`error_file`); None where
    it has none or something else wrote the file."""
    try:
        return ErrorNote.from_json(error_file["message"]["extraInfo"]["dcpqual"])  # type: ignore[index]
    except (ValueError, KeyError, TypeError):  # ValidationError is a ValueError
        return None


@dataclass(frozen=True, config=STRICT)
class Selection(JsonValue):
    """What this rank's pytest was told to select, beside what it collected: the targets it
    was given, those of them that are not the harness's whole suites/ folder, how many
    collected tests -k, -m or --deselect took away, and the paths --ignore left out; and what
    it collected against the harness's own suites/ whatever it was told: the suites files
    that gave no test (`unreached`), the files it collected from outside them (`outside`),
    the tests taken away without being deselected (`removed`: a hook), and the collection
    rules that are not the harness's (`rules`: ini overrides, another config file, a conftest
    or plugin from elsewhere). A run is only as broad as what it selected, so the evidence
    names any narrowing."""

    targets: tuple[str, ...] = ()
    partial_targets: tuple[str, ...] = ()
    deselected: NonNegativeInt = 0
    ignored: tuple[str, ...] = ()
    unreached: tuple[str, ...] = ()
    outside: tuple[str, ...] = ()
    removed: NonNegativeInt = 0
    rules: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        targets: Sequence[str],
        *,
        invocation_dir: Path,
        suites: Path,
        deselected: int = 0,
        ignored: Sequence[str] = (),
        unreached: Sequence[str] = (),
        outside: Sequence[str] = (),
        removed: int = 0,
        rules: Sequence[str] = (),
    ) -> Selection:
        """From pytest's targets as given (relative to `invocation_dir`): a node id, or a path
        other than the `suites` folder itself, is a partial target."""
        whole = suites.resolve()
        partial = [t for t in targets if "::" in t or (invocation_dir / t).resolve() != whole]
        return cls(
            targets=tuple(targets),
            partial_targets=tuple(partial),
            deselected=deselected,
            ignored=tuple(ignored),
            unreached=tuple(unreached),
            outside=tuple(outside),
            removed=removed,
            rules=tuple(rules),
        )


@dataclass(frozen=True, config=STRICT)
class RealTree:
    """One of vLLM's own model trees (`harness.models.real`): what it is, and what the receipt
    must say about it (`limitations`; "key: text" strings in records written before they were
    objects)."""

    model: str
    tp: PositiveInt
    dcp: PositiveInt
    kv_cache_dtype: str
    dcp_comm_backend: str
    draft_kv_cache_dtype: str | None = None  # the draft's own KV cache dtype (None: the target's)
    classes: tuple[str, ...] = ()
    draft_layers: tuple[str, ...] = ()
    shims: tuple[str, ...] = ()
    limitations: tuple[Limitation, ...] = ()

    @field_validator("limitations", mode="before")
    @classmethod
    def _lines(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [Limitation.parse(v) if isinstance(v, str) else v for v in value]
        return value


@dataclass(frozen=True, config=STRICT)
class RealTreeRecord(RealTree):
    """A real tree as one rank built it, with what it cost there."""

    build_s: NonNegativeFloat = 0.0
    import_s: NonNegativeFloat = 0.0
    peak_rss_mib: NonNegativeFloat = 0.0

    def configuration(self) -> RealTree:
        """What identifies the tree, without what it cost on this rank."""
        return RealTree(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RealTree)})


@dataclass(frozen=True, config=STRICT)
class EngineEvent:
    """Something created while vLLM's engine ran (`harness.engine.watch`): in which phase (load,
    warm, capture, decode), what kind (process-group, b12x-transport, kernel), and the stack.
    `control`: created by a negative control's test-only hook (expected, not a failure)."""

    phase: str
    kind: str
    what: str
    lazy: bool
    stack: tuple[str, ...] = ()
    control: str | None = None


@dataclass(frozen=True, config=STRICT)
class EnginePhase:
    """One of vLLM's startup phases on one rank: how often it ran and how long it took."""

    name: str
    entered: NonNegativeInt
    seconds: NonNegativeFloat
    created: NonNegativeInt = 0


@dataclass(frozen=True, config=STRICT)
class EngineServed:
    """DCP calls one path served in one phase: a b12x object's method (`path` "b12x:CLASS.call")
    or vLLM's DCP group coordinator ("other:collective", a call b12x did not serve)."""

    path: str
    phase: str
    calls: NonNegativeInt


@dataclass(frozen=True, config=STRICT)
class EngineControl:
    """A negative control of the engine lane: a test-only hook did `action` (new-group,
    b12x-transport, kernel) `where` (in a lazy phase, or before capture); `caught`: the watch
    named it lazy."""

    action: str
    where: Literal["lazy-phase", "before-capture"]
    phase: str
    caught: bool


@dataclass(frozen=True, config=STRICT)
class EngineRecord:
    """vLLM's own engine as one rank built and ran it in the engine lane."""

    model: str
    architecture: str
    vllm_version: str
    vllm_path: str
    vllm_commit: str | None
    tp: PositiveInt
    dcp: PositiveInt
    engine_args: tuple[str, ...] = ()  # "key=json value", scrubbed by the bundle's scrubber
    engine_env: tuple[str, ...] = ()
    cudagraph_mode: str = ""
    capture_sizes: tuple[int, ...] = ()
    max_num_batched_tokens: NonNegativeInt = 0
    kv_cache_dtype: str = ""
    attention_backend: str = ""
    graphs: tuple[str, ...] = ()  # "MODE=count" as vLLM counted its captured graphs
    phases: tuple[EnginePhase, ...] = ()
    events: tuple[EngineEvent, ...] = ()
    served: tuple[EngineServed, ...] = ()
    seams: tuple[str, ...] = ()  # "seam: armed" or "seam: not armed: why"
    tokens: tuple[tuple[int, ...], ...] = ()
    eager_tokens: tuple[tuple[int, ...], ...] = ()
    controls: tuple[EngineControl, ...] = ()
    build_s: NonNegativeFloat = 0.0
    eager_build_s: NonNegativeFloat = 0.0
    peak_rss_mib: NonNegativeFloat = 0.0
    limitations: tuple[Limitation, ...] = ()

    def b12x_calls(self, phase: str) -> int:
        return sum(s.calls for s in self.served if s.path.startswith("b12x:") and s.phase == phase)

    def other_calls(self) -> int:
        """DCP calls in capture and decode that b12x did not serve (a fallback)."""
        return sum(
            s.calls
            for s in self.served
            if not s.path.startswith("b12x:") and s.phase in ("capture", "decode")
        )

    def phase(self, name: str) -> EnginePhase | None:
        return next((p for p in self.phases if p.name == name), None)


@dataclass(frozen=True, config=STRICT)
class SubworldLane:
    """One lane of a sub-world block: its group size, its ranks, how many cases it ran."""

    size: PositiveInt
    ranks: tuple[NonNegativeInt, ...]
    cases: NonNegativeInt = 0


@dataclass(frozen=True, config=STRICT)
class SubworldBlock:
    """Sub-world cases run side by side on lanes of the world (`harness.rank.subworld`)."""

    block: NonNegativeInt
    lanes: tuple[SubworldLane, ...] = ()


@dataclass(frozen=True, config=STRICT)
class RankFacts:
    """Where a rank's files and tests live, and what it used, kept current while it runs.

    `rootdir`: the pytest rootdir its node ids are relative to; `node_index`: the launcher's
    node whose torchrun/node-KK folder holds its logs; `transports`: the transport backends it
    created ("torch:ag_rs", "b12x"; `transport` is the one-backend form of older records);
    `real_trees`: vLLM's own trees it built; `missing_collection`: the ranks that never
    finished collection within the timeout (this rank's collection abort blames them);
    `subworld`: the blocks of sub-world cases and their lanes; `junit`: whether pytest's
    junitxml writes this rank's own report (junit/rank-NN.xml; False: `-p no:junitxml` or a
    `--junitxml` of the user's, so a report there is not the rank's; None: not recorded)."""

    rootdir: str | None = None
    node_index: NonNegativeInt | None = None
    transports: tuple[str, ...] = ()
    transport: str | None = None
    real_trees: tuple[RealTreeRecord, ...] = ()
    engine: EngineRecord | None = None  # vLLM's own engine (the engine lane)
    missing_collection: tuple[NonNegativeInt, ...] = ()
    subworld: tuple[SubworldBlock, ...] = ()  # the lanes this rank's collection was placed on
    junit: bool | None = None

    def used_transports(self) -> tuple[str, ...]:
        return (*((self.transport,) if self.transport else ()), *self.transports)


@dataclass(frozen=True, config=STRICT)
class RankUse:
    """What a rank has used so far (transports it created, vLLM trees it built), as the code
    that made them reports it to the rank plugin."""

    transports: tuple[str, ...] = ()
    real_trees: tuple[RealTreeRecord, ...] = ()
    engine: EngineRecord | None = None


HASH_PROBE: Final = "dcpqual-hash-seed-probe"


@dataclass(frozen=True, config=STRICT)
class RankStart:
    """How this rank's interpreter began, as the rank itself can tell: `forked` from a preloaded
    interpreter (`harness.rank.parentage`: the agent's forkserver; in bundles written before it,
    the launcher's own rank zygote) or started cold by torchrun; `hash_probe`, its `hash()` of
    `HASH_PROBE`, equal in ranks that share one string-hash seed; `hash_seed_fixed`,
    PYTHONHASHSEED set to a number (every rank has that seed under either launch); `hash_seed`,
    that number, and `hash_seed_drawn`, whether the launcher drew it (it gives every rank of a
    node one). Ranks that share a seed did not exercise a divergence through set iteration
    order.
    `output_relay`: the pid of the relay that writes this rank's output scrubbed
    (`harness.rank.outrelay`; None: none started), which the launcher lets finish its rank's last
    lines instead of counting it as a process the run left behind."""

    forked: bool
    hash_probe: int
    hash_seed_fixed: bool
    output_relay: int | None = None
    # The string-hash seed this rank started with (its PYTHONHASHSEED; None: not recorded, or
    # unset) and whether its launcher drew it (None: not recorded, or no rank plan).
    hash_seed: NonNegativeInt | None = None
    hash_seed_drawn: bool | None = None


@dataclass(frozen=True, config=STRICT)
class Provenance:
    """What code this rank ran, as the rank itself saw it at its start: the digest of the image
    its environment names (None: not inside a `dcpqual gpu16` image) and, on rank 0 only, the
    harness checkout's commit, tree and dirtiness (None elsewhere, or outside a checkout). The
    receipt's `image.digest` and `sources.dcpqual` are held to it, so neither is the evidence
    writer's word alone."""

    image_digest: str | None = None
    harness_commit: str | None = None
    harness_tree: str | None = None
    harness_dirty: bool | None = None
    harness_dirty_paths: tuple[str, ...] = ()

    @classmethod
    def of(cls, image_digest: str | None, checkout: GitIdentity | None = None) -> Provenance:
        """What a rank records: the image, and (rank 0) the checkout, its first dirty paths."""
        if checkout is None:
            return cls(image_digest=image_digest)
        return cls(
            image_digest=image_digest,
            harness_commit=checkout.commit,
            harness_tree=checkout.tree,
            harness_dirty=checkout.dirty,
            harness_dirty_paths=checkout.dirty_paths[:DIRTY_PATHS_SHOWN],
        )


@dataclass(frozen=True, config=STRICT)
class RankRecord(JsonValue):
    """Everything one rank reports. `complete` is False until the rank's session finished;
    a record that never became complete belongs to a rank that died.

    `current_test`: the test running at the last write (None between tests). `abort_primary`:
    the abort was this rank's own fault (collection mismatch, bootstrap failure), not a
    follow-on; `aborted_at`: unix time of the abort. `waiting_since`: unix time this rank
    finished `current_test` and began waiting for its peers' results (None while it runs a test
    or between tests): who is behind, for the progress. `broke_world`: this rank's own action
    broke the world (see `WorldBreak`); the first one only. `start`: how its interpreter
    began (None: not recorded). `provenance`: what code it ran (None: not recorded).
    """

    rank: NonNegativeInt
    world_size: PositiveInt
    local_rank: NonNegativeInt = 0
    node_rank: NonNegativeInt = 0
    hostname: str = ""
    pid: NonNegativeInt = 0
    backend: str = "gloo"
    device: str = "cpu"
    warm_impl: str = "vendored"
    started_at: str = ""
    finished_at: str | None = None
    complete: bool = False
    collected: tuple[str, ...] = ()
    tests: tuple[TestOutcome, ...] = ()
    captures: tuple[CaptureRecord, ...] = ()
    abort_reason: str | None = None
    extra: RankFacts = Field(default_factory=RankFacts)
    current_test: str | None = None
    abort_primary: bool = False
    aborted_at: float | None = None
    waiting_since: float | None = None
    broke_world: WorldBreak | None = None
    tp: PositiveInt | None = None  # the tp and dcp this rank's suites qualified (None: not
    dcp: PositiveInt | None = None  # recorded), and what its pytest was told to select
    selection: Selection | None = None
    start: RankStart | None = None
    provenance: Provenance | None = None
    schema: Literal["dcpqual-rank-record/v1"] = RANK_RECORD_SCHEMA

    @property
    def stopped(self) -> bool:
        """It left because of something outside itself (a peer's failure, torchrun stopping the
        job) and its own record says so: a consequence of the run's fault, not its cause."""
        return bool(self.abort_reason) and not self.abort_primary

    def with_test(self, outcome: TestOutcome) -> RankRecord:
        return replace(self, tests=(*self.tests, outcome))

    def with_capture(self, capture: CaptureRecord) -> RankRecord:
        return replace(self, captures=(*self.captures, capture))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        if not isinstance(data, dict) or data.get("schema") != RANK_RECORD_SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not a {RANK_RECORD_SCHEMA} record: schema={found!r}")
        return super().from_json(data)

    def write(self, path: Path) -> None:
        """Write atomically (temp file + rename), so a reader never sees half a record."""
        text = json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"
        atomic_write_text(path, text, fsync=False)

    @classmethod
    def read(cls, path: Path) -> RankRecord:
        data = read_json(path)
        if not isinstance(data, dict):
            raise ValueError(f"a rank record is a JSON object, not {type(data).__name__}")
        return cls.from_json(data)


def rank_record_path(records_dir: Path, rank: int) -> Path:
    return records_dir / rank_file_name(rank, ".json")


# Where a rank's other files lie in the out folder: written by the rank, read by the launcher
# and the evidence writer.


def junit_path(out_dir: Path, rank: int) -> Path:
    return out_dir / JUNIT_DIR / rank_file_name(rank, ".xml")


def stacks_path(out_dir: Path, rank: int) -> Path:
    return out_dir / STACKS_DIR / rank_file_name(rank, ".txt")
