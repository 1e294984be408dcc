"""The per-rank record (`records/rank-NN.json`): the contract between a rank and the bundle.

The rank plugin fills it while pytest runs; the evidence writer reads it after torchrun exits.
Rank-side code must stay importable without the evidence or launcher packages.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from harness.atomic import atomic_write_text
from harness.capture.records import CaptureRecord
from harness.jsonfile import read_json

RANK_RECORD_SCHEMA = "dcpqual-rank-record/v1"

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


@dataclass(frozen=True)
class TestOutcome:
    """One test's agreed outcome as seen from one rank.

    `primary` is False when this rank failed only because a peer failed first (a follow-on
    error); `failing_ranks` lists the ranks whose own failure was primary, agreed by collective.
    """

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: Outcome
    duration_s: float = 0.0
    message: str | None = None
    primary: bool = True
    failing_ranks: tuple[int, ...] = ()
    # Extensions, all defaulted: when this rank saw its own failure (unix time), and
    # whether the outcome is the ranks' agreed one (False: the rank stopped before agreement).
    failed_at: float | None = None
    agreed: bool = True

    @property
    def suite(self) -> str:
        return suite_of(self.nodeid)

    def to_json(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "suite": self.suite,
            "outcome": self.outcome,
            "duration_s": round(self.duration_s, 6),
            "message": self.message,
            "primary": self.primary,
            "failing_ranks": list(self.failing_ranks),
            "failed_at": self.failed_at,
            "agreed": self.agreed,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TestOutcome:
        if data["outcome"] not in OUTCOMES:
            raise ValueError(f"unknown test outcome {data['outcome']!r}")
        return cls(
            nodeid=data["nodeid"],
            outcome=data["outcome"],
            duration_s=float(data.get("duration_s", 0.0)),
            message=data.get("message"),
            primary=bool(data.get("primary", True)),
            failing_ranks=tuple(data.get("failing_ranks", [])),
            failed_at=data.get("failed_at"),
            agreed=bool(data.get("agreed", True)),
        )


@dataclass(frozen=True)
class WorldBreak:
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

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "test": self.test,
            "at": self.at,
            "message": self.message,
            "signal": self.signal,
            "target": self.target,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorldBreak:
        if data.get("action") not in WORLD_BREAK_ACTIONS:
            raise ValueError(f"unknown world-breaking action {data.get('action')!r}")
        return cls(
            action=data["action"],
            test=data.get("test"),
            at=float(data["at"]),
            message=str(data["message"]),
            signal=data.get("signal"),
            target=data.get("target"),
        )


@dataclass(frozen=True)
class Selection:
    """What this rank's pytest was told to select, beside what it collected: the targets it
    was given, those of them that are not the repository's whole suites/ folder, how many
    collected tests -k, -m or --deselect took away, and the paths --ignore left out. A run is
    only as broad as what it selected, so the evidence names any narrowing."""

    targets: tuple[str, ...] = ()
    partial_targets: tuple[str, ...] = ()
    deselected: int = 0
    ignored: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        targets: Sequence[str],
        *,
        invocation_dir: Path,
        suites: Path,
        deselected: int = 0,
        ignored: Sequence[str] = (),
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
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "targets": list(self.targets),
            "partial_targets": list(self.partial_targets),
            "deselected": self.deselected,
            "ignored": list(self.ignored),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Selection:
        return cls(
            targets=tuple(str(t) for t in data.get("targets", [])),
            partial_targets=tuple(str(t) for t in data.get("partial_targets", [])),
            deselected=int(data.get("deselected", 0)),
            ignored=tuple(str(t) for t in data.get("ignored", [])),
        )


@dataclass(frozen=True)
class RankRecord:
    """Everything one rank reports. `complete` is False until the rank's session finished;
    a record that never became complete belongs to a rank that died."""

    rank: int
    world_size: int
    local_rank: int = 0
    node_rank: int = 0
    hostname: str = ""
    pid: int = 0
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
    extra: dict[str, Any] = field(default_factory=dict)
    # Extensions, all defaulted. `current_test`: the test running at the last write
    # (None between tests). `abort_primary`: the abort was this rank's own fault (collection
    # mismatch, bootstrap failure), not a follow-on. `aborted_at`: unix time of the abort.
    current_test: str | None = None
    abort_primary: bool = False
    aborted_at: float | None = None
    # Extension: unix time this rank finished `current_test` and began waiting for its peers'
    # results (None while it runs a test or between tests): who is behind, for the progress.
    waiting_since: float | None = None
    # Extension: this rank's own action broke the world (see `WorldBreak`); the first one only.
    broke_world: WorldBreak | None = None
    # Extensions: the tp and dcp this rank's suites qualified (None: not recorded), and what
    # its pytest was told to select (None: not recorded).
    tp: int | None = None
    dcp: int | None = None
    selection: Selection | None = None

    @property
    def stopped(self) -> bool:
        """It left because of something outside itself (a peer's failure, torchrun stopping the
        job) and its own record says so: a consequence of the run's fault, not its cause."""
        return bool(self.abort_reason) and not self.abort_primary

    def with_test(self, outcome: TestOutcome) -> RankRecord:
        return replace(self, tests=(*self.tests, outcome))

    def with_capture(self, capture: CaptureRecord) -> RankRecord:
        return replace(self, captures=(*self.captures, capture))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RANK_RECORD_SCHEMA,
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "node_rank": self.node_rank,
            "hostname": self.hostname,
            "pid": self.pid,
            "backend": self.backend,
            "device": self.device,
            "warm_impl": self.warm_impl,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "complete": self.complete,
            "collected": list(self.collected),
            "tests": [t.to_json() for t in self.tests],
            "captures": [c.to_json() for c in self.captures],
            "abort_reason": self.abort_reason,
            "extra": self.extra,
            "current_test": self.current_test,
            "abort_primary": self.abort_primary,
            "aborted_at": self.aborted_at,
            "waiting_since": self.waiting_since,
            "broke_world": None if self.broke_world is None else self.broke_world.to_json(),
            "tp": self.tp,
            "dcp": self.dcp,
            "selection": None if self.selection is None else self.selection.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankRecord:
        if data.get("schema") != RANK_RECORD_SCHEMA:
            raise ValueError(f"not a {RANK_RECORD_SCHEMA} record: schema={data.get('schema')!r}")
        return cls(
            rank=int(data["rank"]),
            world_size=int(data["world_size"]),
            local_rank=int(data.get("local_rank", 0)),
            node_rank=int(data.get("node_rank", 0)),
            hostname=data.get("hostname", ""),
            pid=int(data.get("pid", 0)),
            backend=data.get("backend", "gloo"),
            device=data.get("device", "cpu"),
            warm_impl=data.get("warm_impl", "vendored"),
            started_at=data.get("started_at", ""),
            finished_at=data.get("finished_at"),
            complete=bool(data.get("complete", False)),
            collected=tuple(data.get("collected", [])),
            tests=tuple(TestOutcome.from_json(t) for t in data.get("tests", [])),
            captures=tuple(CaptureRecord.from_json(c) for c in data.get("captures", [])),
            abort_reason=data.get("abort_reason"),
            extra=dict(data.get("extra", {})),
            current_test=data.get("current_test"),
            abort_primary=bool(data.get("abort_primary", False)),
            aborted_at=data.get("aborted_at"),
            waiting_since=data.get("waiting_since"),
            broke_world=(
                WorldBreak.from_json(data["broke_world"]) if data.get("broke_world") else None
            ),
            tp=None if data.get("tp") is None else int(data["tp"]),
            dcp=None if data.get("dcp") is None else int(data["dcp"]),
            selection=(Selection.from_json(data["selection"]) if data.get("selection") else None),
        )

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
    return records_dir / f"rank-{rank:02d}.json"
