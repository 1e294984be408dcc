"""Read what the ranks left (`records/rank-NN.json`) and reduce it to receipt values.

Rules decided here, and why:
- A rank is *killed* when its record is missing, unreadable or not `complete`: only a rank whose
  pytest session finished marks its record complete.
- Signatures are merged over ranks and over the non-negative-control capture windows that
  reported them: `warmed` is true only if every report said warmed (a transport is collective:
  one rank without it creates it lazily), `used_in_capture` is true if any report said used. Both
  lean towards showing the failure this harness exists to catch: used, but not warmed everywhere.
  Negative-control windows leave lazy work on purpose and are kept out of the table.
- The root cause is the earliest failure in test order (each rank's `collected` order, which is
  the same on every rank), a rank that left no record at all being earliest of all; at the same
  test, a rank whose record says its own action broke the world (`broke_world`: it destroyed
  its process group, or signalled its torchrun agent) beats everything, and every follow-on or
  stopped rank at any test (its consequences; a peer that lagged behind meets them at an
  earlier test); then a primary test failure beats a killed rank, which beats lazy events,
  missed negative controls and unwarmed signatures, and lower ranks come first. A rank that did
  not finish but whose record says why it was stopped (SIGTERM from torchrun, a peer's failure:
  a non-primary `abort_reason`) comes last: it ended because of another rank, typically one
  that died without a word, and must never win a tie against it. Follow-ons and stopped ranks
  are consequences: whenever a record shows a cause, at any test, they are not candidates (the
  ranks of a lane of sub-world cases, `harness.rank.subworld`, can be at an earlier case than
  the one another lane failed).
- Coverage: a test a rank collected but has no outcome for did not run there. A rank that
  finished its session with such tests ended it early (`pytest.exit`): that is a root cause of
  its own ("no-outcome"), found at the first test it skipped over.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.evidence.engine_lane import engine_lane, with_engine_controls
from harness.evidence.run_context import TorchrunFailure
from harness.schema.capture import BLIND_SPOTS, CaptureRecord
from harness.schema.launch import HashSeedMode
from harness.schema.layout import RECORDS_DIR
from harness.schema.rank_record import RankRecord, RealTree, rank_record_path
from harness.schema.receipt import (
    Capture,
    CaptureEvent,
    Coverage,
    HashSeed,
    Models,
    NegativeControl,
    RootCause,
    RootCauseKind,
    Selection,
    SignatureRow,
)

# Priority of root-cause kinds found at the same test position (lower wins).
_PRIORITY: dict[str, int] = {
    "broke-world": -1,  # the rank's own action broke every rank's world (`RankRecord.broke_world`)
    "test": 0,
    "killed": 1,
    "lazy-event": 2,
    "negative-control": 3,
    "signature": 4,
    "no-outcome": 5,
    "follow-on": 6,
    "stopped": 7,  # killed, but its record names why it was stopped: a consequence, not a cause
}


@dataclass(frozen=True)
class RankFiles:
    """The rank records found for the expected ranks."""

    world_size: int
    records: dict[int, RankRecord] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)  # rank -> why

    @property
    def killed(self) -> list[int]:
        return [
            r
            for r in range(self.world_size)
            if r not in self.records or not self.records[r].complete
        ]

    @property
    def stopped(self) -> list[int]:
        """The killed ranks whose record says they were stopped (see `RankRecord.stopped`)."""
        return [r for r in self.killed if r in self.records and self.records[r].stopped]

    @property
    def complete(self) -> int:
        return sum(1 for rec in self.records.values() if rec.complete)

    def captures(self) -> list[CaptureRecord]:
        return [c for r in sorted(self.records) for c in self.records[r].captures]


def load_records(out_dir: Path, world_size: int) -> RankFiles:
    """Read `records/rank-NN.json` for ranks 0..world_size-1; unreadable files are noted."""
    records: dict[int, RankRecord] = {}
    unreadable: dict[int, str] = {}
    for rank in range(world_size):
        path = rank_record_path(out_dir / RECORDS_DIR, rank)
        if not path.exists():
            continue
        try:
            record = RankRecord.read(path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            unreadable[rank] = f"{type(exc).__name__}: {exc}"
            continue
        if record.rank != rank:
            unreadable[rank] = f"file of rank {rank} holds the record of rank {record.rank}"
            continue
        records[rank] = record
    return RankFiles(world_size, records, unreadable)


def in_progress(record: RankRecord) -> str | None:
    """The test an incomplete rank was running when it died: first collected, not reported."""
    done = {t.nodeid for t in record.tests}
    return next((nodeid for nodeid in record.collected if nodeid not in done), None)


def without_outcome(record: RankRecord) -> list[str]:
    """The tests this rank collected and reported no outcome for, in collection order."""
    done = {t.nodeid for t in record.tests}
    return [nodeid for nodeid in record.collected if nodeid not in done]


def coverage_of(ranks: RankFiles) -> Coverage:
    """Selected tests against outcomes over every rank that left a record."""
    collected: set[str] = set()
    missing: list[tuple[int, int, str]] = []  # (position, rank, test)
    for rank, record in sorted(ranks.records.items()):
        collected.update(record.collected)
        positions = {nodeid: i for i, nodeid in enumerate(record.collected)}
        missing += [(positions[n], rank, n) for n in without_outcome(record)]
    first = min(missing, default=None)
    everywhere, partly = skipped_tests(ranks)
    bodiless = _in_order(
        t.nodeid for _, record in sorted(ranks.records.items()) for t in record.tests if t.no_body
    )
    return Coverage(
        collected=len(collected),
        without_outcome=len(missing),
        first_without_outcome=None if first is None else f"rank {first[1]}: {first[2]}",
        skipped_everywhere=len(everywhere),
        first_skipped_everywhere=everywhere[0] if everywhere else None,
        skipped_on_some_ranks=len(partly),
        first_skipped_on_some_ranks=partly[0] if partly else None,
        no_body=len(bodiless),
        first_no_body=bodiless[0] if bodiless else None,
    )


def skipped_tests(ranks: RankFiles) -> tuple[list[str], list[str]]:
    """(tests skipped on every rank that reported them, tests skipped on some ranks and run on
    others), in the order the ranks ran them; a sub-world case another lane ran counts as
    neither here (its lane's outcome is the test's). A skip is a path that did not run, so a
    receipt names both (see rules.skip_limitation)."""
    order: dict[str, None] = {}
    skipped: dict[str, list[int]] = {}
    ran: dict[str, list[int]] = {}
    for rank, record in sorted(ranks.records.items()):
        for test in record.tests:
            order.setdefault(test.nodeid)
            if test.ran_elsewhere:
                continue
            into = skipped if test.outcome == "skipped" else ran
            into.setdefault(test.nodeid, []).append(rank)
    everywhere: list[str] = []
    partly: list[str] = []
    for nodeid in order:
        if nodeid not in ran:
            if nodeid in skipped:  # else no rank reached it (its lane stopped): no outcome
                everywhere.append(nodeid)
        elif nodeid in skipped:
            partly.append(
                f"{nodeid} (skipped on ranks {_spans(skipped[nodeid])}, ran on ranks "
                f"{_spans(ran[nodeid])})"
            )
    return everywhere, partly


def _spans(ranks: list[int]) -> str:
    """[0-3, 5] for 0, 1, 2, 3, 5: short enough for 16 ranks and more."""
    parts: list[str] = []
    start = prev = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return "[" + ", ".join(parts) + "]"


def selection_of(ranks: RankFiles) -> Selection | None:
    """What the ranks were told to select, over every rank that says (None: none says)."""
    said = [r.selection for _, r in sorted(ranks.records.items()) if r.selection is not None]
    if not said:
        return None
    return Selection(
        targets=_in_order(t for s in said for t in s.targets),
        partial_targets=_in_order(t for s in said for t in s.partial_targets),
        deselected=max(s.deselected for s in said),
        ignored=_in_order(t for s in said for t in s.ignored),
        unreached=_in_order(t for s in said for t in s.unreached),
        outside=_in_order(t for s in said for t in s.outside),
        removed=max(s.removed for s in said),
        rules=_in_order(t for s in said for t in s.rules),
    )


def hash_seed_of(records: Mapping[int, RankRecord]) -> HashSeedMode | None:
    """The string-hash seeds of the ranks of `records` (one node's) as the records
    show them (None: no record says): fixed where PYTHONHASHSEED was; one shared random seed
    where a rank was forked or two ranks hashed the probe alike (ranks that drew their own seeds
    do not); else each rank's own."""
    said = [r.start for _, r in sorted(records.items()) if r.start is not None]
    if not said:
        return None
    if any(s.hash_seed_fixed for s in said):
        return "fixed"
    probes = Counter(s.hash_probe for s in said)
    if any(s.forked for s in said) or max(probes.values()) > 1:
        return "shared-random"
    return "per-rank-random"


def hash_seeds_of(records: Mapping[int, RankRecord]) -> list[HashSeed] | None:
    """The string-hash seeds the ranks say they started with, by node and seed, each with the
    ranks that did (None: no record says, as records written before the launcher fixed one); a
    seed is given only where its records say so (`hash_seed_drawn` False)."""
    groups: dict[tuple[int, int, bool], list[int]] = {}
    for rank, record in sorted(records.items()):
        start = record.start
        if start is None or start.hash_seed is None:
            continue
        # a seed no record calls given is taken for drawn: the limitation errs on its side
        key = (record.node_rank, start.hash_seed, start.hash_seed_drawn is not False)
        groups.setdefault(key, []).append(rank)
    if not groups:
        return None
    return [
        HashSeed(node=node, seed=seed, drawn=drawn, ranks=ranks)
        for (node, seed, drawn), ranks in sorted(groups.items())
    ]


def _in_order(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def transports(ranks: RankFiles) -> list[str]:
    """Transport backends the ranks say they ran (record `extra.used_transports()`), e.g.
    "torch:ag_rs", "torch:a2a" or "b12x"."""
    return sorted({t for record in ranks.records.values() for t in record.extra.used_transports()})


def rank_hosts(ranks: RankFiles) -> list[str]:
    """The hosts the rank records report, as `host_digest`s, each once, sorted (records
    without one: none): the receipt names no machine."""
    from harness.evidence.environment import host_digest

    return sorted(
        {host_digest(record.hostname) for record in ranks.records.values() if record.hostname}
    )


def model_sources(ranks: RankFiles) -> Models:
    """Which model trees the ranks built from vLLM's own classes (record `extra.real_trees`):
    the models, one tree per distinct configuration, the largest build time and peak RSS, and
    the ranks that built any; empty when only stand-ins ran."""
    trees: dict[RealTree, None] = {}
    build_s: list[float] = []
    rss: list[float] = []
    ranks_built: list[int] = []
    for rank, record in sorted(ranks.records.items()):
        if not record.extra.real_trees:
            continue
        ranks_built.append(rank)
        for tree in record.extra.real_trees:
            build_s.append(tree.build_s + tree.import_s)
            rss.append(tree.peak_rss_mib)
            trees.setdefault(tree.configuration(), None)
    return Models(
        real=sorted({t.model for t in trees}),
        trees=list(trees),
        build_s_max=max(build_s, default=0.0),
        peak_rss_mib_max=max(rss, default=0.0),
        ranks_with_real_trees=ranks_built,
        engine=engine_lane(ranks.records),
    )


def merge_signatures(captures: Iterable[CaptureRecord]) -> list[SignatureRow]:
    """The signature table (see the module docstring for the merge rule)."""
    reports: dict[tuple[Any, ...], dict[int, list[tuple[bool, bool]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for capture in captures:
        if capture.negative_control:
            continue
        for use in capture.signatures:
            sig = use.signature
            key = (
                use.model,
                sig.total_heads,
                sig.query_head_dim,
                sig.output_head_dim,
                sig.dtype,
                sig.dcp_world_size,
                sig.max_tokens,
                sig.device_type,
                sig.query_dtype,
                sig.comm_backend,
            )
            reports[key][capture.rank].append((use.warmed, use.used_in_capture))
    rows = []
    for key in sorted(reports):
        by_rank = reports[key]
        per_rank = {
            rank: (all(w for w, _ in uses), any(u for _, u in uses))
            for rank, uses in by_rank.items()
        }
        model, heads, qdim, odim, dtype, dcp, max_tokens, device_type, qdtype, comm = key
        rows.append(
            SignatureRow(
                model=model,
                total_heads=heads,
                query_head_dim=qdim,
                output_head_dim=odim,
                dtype=dtype,
                warmed=all(w for w, _ in per_rank.values()),
                used_in_capture=any(u for _, u in per_rank.values()),
                dcp_world_size=dcp,
                max_tokens=max_tokens,
                device_type=device_type,
                query_dtype=qdtype,
                comm_backend=comm,
                ranks=sorted(per_rank),
                consistent=len(set(per_rank.values())) == 1,
            )
        )
    return rows


def unwatched(windows: Iterable[CaptureRecord], every: Iterable[CaptureRecord]) -> dict[str, str]:
    """Each detector that did not watch every window of `windows`, with why (sorted by name).

    A detector watched a window only where the window lists it as active. Which detectors a
    window should list comes from the run's own capture records (`every`, negative controls
    included): the capture code gives every window, whatever its path, the same detector set
    (`harness.capture.check.default_detectors`, those that cannot run there listed inactive
    with the reason), so a detector any record lists, active or not, is expected in each window,
    and a window whose list lacks it was not watched by it. Controls count because a window's
    list can be trimmed alone but the controls' lists name the same detectors. The set is not
    pinned to the capture code's names: that would hold hand-built records (a test's) to
    detectors they never had, and trimming a detector from every record is no harder than
    dropping every list. Blind spots (`BLIND_SPOTS`) are listed only where they apply: they
    count where listed, and are not expected elsewhere.

    Records written before windows recorded their detectors list none anywhere, and nothing is
    expected of them. Where any record lists detectors, a window that lists none was watched by
    none of them.
    """
    windows = list(windows)
    inactive: dict[str, str] = {}
    for window in windows:
        for status in window.detectors:
            if not status.active:
                inactive.setdefault(status.name, status.reason or "not active")
    expected = {s.name for c in every for s in c.detectors} - BLIND_SPOTS
    for name in sorted(expected - set(inactive)):
        absent = sum(1 for w in windows if name not in {s.name for s in w.detectors})
        if absent:
            inactive[name] = f"absent from {absent} of {len(windows)} windows"
    return dict(sorted(inactive.items()))


def summarize_capture(ranks: RankFiles) -> tuple[Capture, NegativeControl]:
    """Lazy events of the real capture windows, and the negative-control windows apart (with
    the engine lane's lazy-phase controls, which are such windows inside vLLM's own engine).

    Events count whatever their phase: lazy work in a window's warm-up iterations still means
    warmup did not create what the step uses.
    """
    windows = [c for c in ranks.captures() if not c.negative_control]
    controls = [c for c in ranks.captures() if c.negative_control]
    events = [
        CaptureEvent(
            rank=e.rank,
            test=c.test,
            detector=e.detector,
            what=e.what,
            signature=None if e.signature is None else e.signature.describe(),
            phase=e.phase,
        )
        for c in windows
        for e in c.events
    ]
    inactive = unwatched(windows, ranks.captures())
    per_rank = dict.fromkeys(sorted(ranks.records), 0)
    for event in events:
        per_rank[event.rank] = per_rank.get(event.rank, 0) + 1
    capture = Capture(
        lazy_events=len(events),
        by_detector=dict(sorted(Counter(e.detector for e in events).items())),
        per_rank=per_rank,
        windows=len(windows),
        paths=dict(sorted(Counter(c.path for c in windows).items())),
        events=events,
        replays=sum(c.replays for c in windows),
        inactive_detectors=inactive,
    )
    control_events = [e for c in controls for e in c.events]
    negative = NegativeControl(
        expected=len(controls),
        detected=sum(1 for c in controls if c.detected),
        lazy_events=len(control_events),
        by_detector=dict(sorted(Counter(e.detector for e in control_events).items())),
        missed=[f"rank {c.rank}: {c.test}" for c in controls if not c.detected],
    )
    return capture, with_engine_controls(negative, ranks.records)


@dataclass(frozen=True, order=True)
class _Candidate:
    position: int
    priority: int
    rank: int
    test: str | None = field(compare=False)
    message: str = field(compare=False)
    kind: RootCauseKind = field(compare=False)


def _position(record: RankRecord, nodeid: str | None) -> int:
    if nodeid is not None and nodeid in record.collected:
        return record.collected.index(nodeid)
    if nodeid is not None:
        done = [t.nodeid for t in record.tests]
        if nodeid in done:
            return len(record.collected) + done.index(nodeid)
    return len(record.collected) + len(record.tests)


def _hung_in_collection(ranks: RankFiles) -> list[_Candidate]:
    """Ranks their peers gave up waiting for at collection, and that never collected: the
    cause, ahead of the peers' aborts and their own stopping (both consequences)."""
    found = []
    for waiter, record in sorted(ranks.records.items()):
        for rank in record.extra.missing_collection:
            own = ranks.records.get(rank)
            if not isinstance(rank, int) or (own is not None and own.collected):
                continue
            message = (
                f"rank {rank} hung during collection: rank {waiter} gave up waiting "
                f"({record.abort_reason})"
            )
            found.append(_Candidate(-1, _PRIORITY["test"], rank, None, message, "killed"))
            return found
    return found


def _candidates(ranks: RankFiles, timed_out: bool) -> list[_Candidate]:
    found: list[_Candidate] = []
    why_dead = "killed at the run's timeout" if timed_out else "died"
    for rank in ranks.killed:
        record = ranks.records.get(rank)
        if record is None:
            note = ranks.unreadable.get(rank)
            detail = f"its record is unreadable ({note})" if note else "it left no record"
            found.append(
                _Candidate(-1, 0, rank, None, f"rank {rank} {why_dead}: {detail}", "killed")
            )
            continue
        test = in_progress(record)
        where = f"while running {test}" if test else "after its last test"
        message = f"rank {rank} {why_dead} {where} (record not complete)"
        if record.abort_reason:
            message += f": {record.abort_reason}"
        priority = _PRIORITY["stopped" if record.stopped else "killed"]
        found.append(_Candidate(_position(record, test), priority, rank, test, message, "killed"))
    found.extend(_hung_in_collection(ranks))
    for rank, record in sorted(ranks.records.items()):
        if (broke := record.broke_world) is not None:
            position = _position(record, broke.test)
            found.append(
                _Candidate(
                    position,
                    _PRIORITY["broke-world"],
                    rank,
                    broke.test,
                    broke.message,
                    "broke-world",
                )
            )
        unrun = without_outcome(record) if record.complete else []
        if unrun:
            # A rank whose record says it was stopped ended early because of another's fault.
            priority = _PRIORITY["stopped" if record.stopped else "no-outcome"]
            found.append(
                _Candidate(
                    _position(record, unrun[0]),
                    priority,
                    rank,
                    unrun[0],
                    f"rank {rank} ended its session without running {unrun[0]} "
                    f"({len(unrun)} of its {len(record.collected)} collected tests have no "
                    "outcome)",
                    "no-outcome",
                )
            )
        for outcome in record.tests:
            if outcome.outcome not in ("failed", "error"):
                continue
            message = outcome.message or f"{outcome.outcome} on rank {rank}"
            position = _position(record, outcome.nodeid)
            if outcome.primary:
                found.append(
                    _Candidate(position, _PRIORITY["test"], rank, outcome.nodeid, message, "test")
                )
            else:
                blamed = outcome.failing_ranks[0] if outcome.failing_ranks else rank
                found.append(
                    _Candidate(
                        position,
                        _PRIORITY["follow-on"],
                        blamed,
                        outcome.nodeid,
                        f"follow-on failure on rank {rank}: {message}",
                        "test",
                    )
                )
        for capture in record.captures:
            position = _position(record, capture.test)
            if capture.negative_control:
                if not capture.detected:
                    seen = sorted({e.detector for e in capture.events})
                    found.append(
                        _Candidate(
                            position,
                            _PRIORITY["negative-control"],
                            rank,
                            capture.test,
                            "negative control not detected: expected detectors "
                            f"{list(capture.expected_detectors)}, saw {seen}",
                            "negative-control",
                        )
                    )
                continue
            if capture.events:
                event = capture.events[0]
                found.append(
                    _Candidate(
                        position,
                        _PRIORITY["lazy-event"],
                        rank,
                        capture.test,
                        f"lazy specialization during capture: {event.detector}: {event.what}",
                        "lazy-event",
                    )
                )
            for use in capture.signatures:
                if use.used_in_capture and not use.warmed:
                    found.append(
                        _Candidate(
                            position,
                            _PRIORITY["signature"],
                            rank,
                            capture.test,
                            f"{use.model}: signature {use.signature.describe()} was used in "
                            "capture but not warmed",
                            "signature",
                        )
                    )
    return found


def _same_failure(torchrun_says: str, cause: str) -> bool:
    """torchrun's error file repeats the rank's own failure (the rank wrote it): adding it to
    the cause would say the same thing twice."""
    first = next((ln.strip() for ln in cause.splitlines() if ln.strip()), "")
    return bool(first) and first in torchrun_says


def find_root_cause(
    ranks: RankFiles,
    *,
    timed_out: bool,
    torchrun_error: TorchrunFailure | None,
    junit_failures: Iterable[tuple[int, str, str]] = (),
    reasons: Iterable[str] = (),
    interrupted: str | None = None,
    node_gone: str | None = None,
) -> RootCause | None:
    """The earliest failure, or None when nothing failed (see the module docstring).

    An interrupted run's root cause is the interruption (`interrupted`: how it is named): the
    ranks' own endings are its consequences. So is a node 0 that died without writing the
    bundle (`node_gone`: how it is named), for a run not interrupted first: its ranks' endings
    are the wake of their node's death.

    Falls back, in order, to torchrun's error file, the first failing JUnit testcase of a rank
    without a record, and the first verdict reason (e.g. "torchrun exited with code 1").
    """
    if interrupted:
        return RootCause(rank=None, test=None, message=interrupted, kind="interrupted")
    if node_gone:
        return RootCause(rank=None, test=None, message=node_gone, kind="node-gone")
    torchrun_rank, torchrun_message = (
        (None, None) if torchrun_error is None else torchrun_error.cause()
    )
    candidates = sorted(_candidates(ranks, timed_out))
    causes = [c for c in candidates if c.priority < _PRIORITY["follow-on"]]
    if causes:
        # Consequences (follow-ons, stopped ranks) can land at an earlier test than their
        # cause: on a peer that lagged behind a rank that broke the world, or on a lane of
        # sub-world cases that was at an earlier case when a rank of another lane left. Never
        # ahead of a cause; in lockstep they sit at the same test as theirs.
        candidates = causes
    if candidates:
        best = candidates[0]
        message = best.message
        said = None if torchrun_error is None else torchrun_error.message
        if said and torchrun_rank == best.rank and not _same_failure(said, message):
            message += f" [torchrun: {said}]"  # what torchrun adds, without its file's path
        return RootCause(rank=best.rank, test=best.test, message=message, kind=best.kind)
    if torchrun_message:
        return RootCause(rank=torchrun_rank, test=None, message=torchrun_message, kind="torchrun")
    for rank, test, message in junit_failures:
        return RootCause(rank=rank, test=test, message=message, kind="junit")
    for reason in reasons:
        return RootCause(rank=None, test=None, message=reason, kind="run")
    return None
