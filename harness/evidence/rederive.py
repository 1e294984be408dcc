"""Hold a receipt to the facts its bundle's rank records and JUnit reports give.

A receipt is a summary of files that are themselves in the bundle and covered by its hashes:
`records/rank-NN.json` and `junit/rank-NN.xml`. `dcpqual verify` derives the receipt's facts
from them again with the derivation the writer used (harness.evidence.derive) and rejects a
receipt that says anything else, field by field, naming the first difference. So an edited
receipt cannot claim fewer lazy events, a flipped verdict, fewer killed ranks, other tallies or
skip reasons (even with junit/merged.xml edited to match), other signatures, other real trees
(`models`, which the real-tree limitations follow from), a selection other than the ranks'
pytest was told to make (so a narrowed run cannot drop its `selection` limitation), hosts,
failed tests, rootdir, root cause or harness checkout (`sources.dcpqual`), even with every hash
regenerated: it would have to edit the records consistently too (only a signature protects
against that; see the README).

Coverage, the failed-test list and the rootdir are held to the records whatever the receipt
states: a receipt without them (from before they were recorded, or with them dropped) fails,
so dropping one cannot switch its check off. Skip reasons are held where the receipt states
them: a receipt without them counts the runner's own cases as tests, the layout from before
they were stated, which records that state the launcher's string-hash seed (written later)
cannot claim.

The launcher's facts the writer takes as given rather than from the records (geometry, warm
code, image digest, the root cause's rank, test and kind) are held to the records that exist by
the derivation's own check (`Derived.corroborations`), with the receipt's statement of them as
the launcher's; and each node's zygote, held to how that node's ranks say they started.

Not re-derived, because no rank file records it: the run's exit code and timeout (the
launcher's view; verify holds them to the launcher's record of the launch, and that record to
the bundle's launch.json and node markers), tp and dcp of records that predate them, the rest
of the environment (GPUs, driver, NCCL), the image's runtime check and the peers' versions. The
root cause's rank, test and kind, and where they agree its text (which quotes torchrun's error
file where that names the same rank), are re-derived whenever the records name a cause,
whatever kind the receipt gives it (not for an interrupted run, whose cause verify holds to the
launcher's record of the interruption, nor for the fallbacks to JUnit or the verdict's
reasons), and a cause of a kind only the records give is refused where they name none. A cause
the receipt says torchrun reported is held to the bundle's own copy of torchrun's error files
(`harness.evidence.torchrun_errors`, read as the launcher read them), its text too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.evidence import hashprobe, rules
from harness.evidence.collect import RankFiles, hash_seed_of
from harness.evidence.derive import Derived, derive
from harness.evidence.junit import Case, mangle, read_merged, tallies
from harness.evidence.torchrun_errors import first_torchrun_error
from harness.schema.launch import ZygoteState
from harness.schema.layout import MERGED_JUNIT, RECEIPT_NAME, RECORDS_DIR
from harness.schema.rank_record import RankRecord, RankStart, junit_path, rank_record_path
from harness.schema.receipt import HashSeed, Receipt

SOURCE = "the rank records and JUnit reports"
# What the launcher's seed makes of one node's ranks: one seed, and one hash of the probe for it.
ONE_SEED = "one seed per node"
ONE_PROBE = "one value for one seed"


@dataclass(frozen=True)
class Disagreement:
    """The first place where a stated value and the re-derived one differ."""

    field: str
    stated: Any
    derived: Any

    def describe(self, holder: str = RECEIPT_NAME) -> str:
        return (
            f"{holder}: {self.field} is {_show(self.stated)} but {SOURCE} say {_show(self.derived)}"
        )


def _show(value: Any) -> str:
    text = "absent" if value is _ABSENT else repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


_ABSENT = object()


def first_difference(path: str, mine: Any, theirs: Any) -> Disagreement | None:
    """The first differing leaf of two JSON values, depth first, keys in sorted order."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in sorted(set(mine) | set(theirs), key=str):
            found = first_difference(
                f"{path}.{key}", mine.get(key, _ABSENT), theirs.get(key, _ABSENT)
            )
            if found:
                return found
        return None
    if isinstance(mine, list) and isinstance(theirs, list):
        for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
            found = first_difference(f"{path}[{i}]", a, b)
            if found:
                return found
        if len(mine) != len(theirs):
            return Disagreement(f"{path} length", len(mine), len(theirs))
        return None
    if type(mine) is type(theirs) and mine == theirs:
        return None
    return Disagreement(path, mine, theirs)


def derive_stated(bundle: Path, receipt: Receipt) -> Derived:
    """The bundle's facts, derived as the writer derived the receipt's, with the launcher's
    facts the receipt states (its `run`, its harness version) in place of the launcher's own,
    and the bundle's copy of torchrun's error files."""
    harness = receipt.sources.get("dcpqual")
    return derive(
        bundle,
        receipt.geometry,
        receipt.run,
        warm_impl=receipt.warm_impl,
        image=receipt.image,
        runner_cases=receipt.skip_reasons is None,  # written before: counted them as tests
        harness_version=None if harness is None else harness.version,
        torchrun_error=first_torchrun_error(bundle),
    )


def derived_facts(
    bundle: Path, receipt: Receipt, derived: Derived
) -> Iterator[tuple[str, str, Any, Any]]:
    """(file, field, its value, re-derived value) as JSON, in the order they are reported
    (`derived`: `derive_stated` of this bundle and receipt).

    Tallies are checked on junit/merged.xml, which verify already holds the receipt's tallies
    to: each fact is checked once, where it is first stated.
    """
    r, cause = RECEIPT_NAME, receipt.root_cause
    for fact in derived.corroborations(cause):
        yield r, fact.field, fact.stated, fact.recorded
    yield r, "verdict", receipt.verdict, derived.verdict
    yield r, "ranks", _dump(receipt.ranks), _dump(derived.ranks)
    cases: tuple[Case, ...] | None = None
    try:
        cases = read_merged(bundle / MERGED_JUNIT)
    except (OSError, ValueError):
        pass  # an unreadable merged.xml is reported by verify's consistency check
    else:
        stated = tallies(cases, runner_cases=receipt.skip_reasons is None)
        yield MERGED_JUNIT, "suites", _dump(stated), _dump(derived.suites)
    if receipt.skip_reasons is not None or derived.hash_seeds is not None:
        # Receipts written before skip reasons do not state them, and are read in the layout of
        # then (no `engine` limitation owed, the summary of then); records that state the
        # launcher's string-hash seed came later, so their receipt cannot claim that layout.
        yield r, "skip_reasons", receipt.skip_reasons, derived.skip_reasons
    if cases is not None:  # each rank's case, not only their counts: which test failed, and why
        yield MERGED_JUNIT, "cases", _by_case(cases), _by_case(derived.merged.cases)
    yield r, "coverage", _dump(receipt.coverage), _dump(derived.coverage)
    yield r, "capture", _dump(receipt.capture), _dump(derived.capture)
    yield r, "negative_control", _dump(receipt.negative_control), _dump(derived.negative_control)
    yield r, "signatures", _dump(receipt.signatures), _dump(derived.signatures)
    yield r, "transports", receipt.transports, derived.transports
    yield r, "selection", _dump(receipt.selection), _dump(derived.selection)
    yield r, "models", _dump(receipt.models), _dump(derived.models)
    yield r, "environment.hosts", receipt.environment.hosts, derived.hosts
    yield from _launch_facts(receipt, derived.rank_files)
    yield r, "hash_seeds", _dump(receipt.hash_seeds), _dump(derived.hash_seeds)
    env = receipt.environment
    computed = hashprobe.computable(env.python, env.platform)
    yield from _hash_seed_facts(derived.hash_seeds or [], derived.rank_files.records, computed)
    if derived.harness is not None:  # rank 0's record names the checkout
        yield r, "sources.dcpqual", _dump(receipt.sources.get("dcpqual")), _dump(derived.harness)
    # held to the records with the stated root cause, so an emptied list cannot hide failures
    yield r, "failed_tests", _dump(receipt.failed_tests), _dump(derived.failed_tests_for(cause))
    yield r, "run.rootdir", receipt.run.rootdir, derived.rootdir
    yield r, "failures", receipt.failures, derived.failures  # last: it sums up the facts above


def _by_case(cases: Iterable[Case]) -> dict[str, dict[str, str]]:
    """merged.xml's cases as JSON, keyed by rank and test (each once, as `merge_junit` gives
    them), so a difference names the case."""
    return {
        f"rank {c.rank:02d} {c.suite}: {c.classname}::{c.name}": {
            "outcome": c.outcome,
            "message": c.message,
            "source": c.source,
        }
        for c in cases
    }


def _dump(value: Any) -> Any:
    """A receipt value as JSON, to compare leaf by leaf."""
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _dump(v) for k, v in value.items()}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


def _hash_seed_facts(
    seeds: list[HashSeed], records: Mapping[int, RankRecord], computed: bool = False
) -> Iterator[tuple[str, str, Any, Any]]:
    """The seeds the records state, held to what the ranks hashed: the launcher gives each node
    one seed, and ranks that started with one seed hash the probe alike (a rank forked from an
    interpreter started without it would not, whatever its environment says); where `computed`
    (the ranks' Python hashes as `hashprobe` computes), they hash it as their seed does, which
    ranks all forked from an interpreter with another seed do not. Where any record
    states a seed every record does: a rank without one started otherwise, and would leave its
    node's shared seed looking like fewer ranks'."""
    if seeds:
        for rank, record in sorted(records.items()):
            start = record.start
            if start is None or start.hash_seed is None:
                field = "start" if start is None else "start.hash_seed"
                said = "a seed, as the other ranks' records state theirs"
                yield RECEIPT_NAME, f"hash_seeds: rank {rank}'s {field}", None, said
    by_node: dict[int, list[HashSeed]] = {}
    for seed in seeds:
        by_node.setdefault(seed.node, []).append(seed)
    for node, found in sorted(by_node.items()):
        if len(found) > 1:
            said = ", ".join(f"{s.seed} ({'drawn' if s.drawn else 'given'})" for s in found)
            yield RECEIPT_NAME, f"hash_seeds: node {node}'s ranks started with", said, ONE_SEED
    for seed in seeds:
        starts = [s for r in seed.ranks if (s := records[r].start) is not None]
        probes = sorted({s.hash_probe for s in starts})
        where = f"hash_seeds: node {seed.node}'s ranks with seed {seed.seed} hashed the probe to"
        if len(probes) > 1:
            yield RECEIPT_NAME, where, ", ".join(map(str, probes)), ONE_PROBE
        elif computed:
            yield RECEIPT_NAME, where, probes[0], hashprobe.probe_hash(seed.seed)


def _launch_facts(receipt: Receipt, rank_files: RankFiles) -> Iterator[tuple[str, str, Any, Any]]:
    """How the ranks started, held to what each rank recorded of its own start (records that
    predate it say nothing). A string-hash seed is its zygote's, so each node's zygote (node
    0's launch, the other nodes' markers) is held to its own node's ranks only: a receipt of
    forked ranks cannot drop the `hash-seed` limitation by calling a node's seeds its ranks'
    own or by leaving that node's zygote out."""
    g = receipt.geometry
    launch = receipt.run.extra.launch
    zygote = None if launch is None else launch.zygote
    if g.nnodes == 1:
        yield from _zygote_facts(
            "run.extra.launch.zygote", zygote, g.world_size, rank_files.records
        )
        return
    writer = rules.launch_node(receipt.run)
    zygotes = rules.node_zygotes(zygote, receipt.run.extra.nodes, writer)
    for node in sorted(set(zygotes) | {x.node_rank for x in rank_files.records.values()}):
        if node == 0 and writer != 0:
            continue  # node 0 died without saying how its ranks started: nothing to hold
        records = {r: x for r, x in rank_files.records.items() if x.node_rank == node}
        yield from _zygote_facts(
            f"node {node}'s zygote", zygotes.get(node), g.nproc_per_node, records
        )


def _zygote_facts(
    where: str, zygote: ZygoteState | None, ranks: int, records: Mapping[int, RankRecord]
) -> Iterator[tuple[str, str, Any, Any]]:
    """One node's zygote (None: the receipt names none), held to the `records` of that node's
    `ranks`: its counts, and the string-hash seed mode those records show."""
    starts = [x.start for x in records.values()]
    if zygote is not None:
        yield from _zygote_counts(where, zygote, ranks, starts)
    derived = hash_seed_of(records)
    if derived is None:
        return
    if zygote is None:
        if derived == "shared-random":  # torchrun started each rank: each drew its own
            yield RECEIPT_NAME, where, None, "ranks forked from a zygote"
        return
    yield RECEIPT_NAME, f"{where}.hash_seed", zygote.hash_seed, derived
    if derived == "shared-random" and any(s is not None and s.forked for s in starts):
        yield RECEIPT_NAME, f"{where}.used", zygote.used, True


def _zygote_counts(
    where: str, zygote: ZygoteState, ranks: int, starts: list[RankStart | None]
) -> Iterator[tuple[str, str, Any, Any]]:
    """A node's zygote's counts, held to each other, to its node's `ranks` and, where each of
    those ranks recorded its start (`starts`), to how many say they were forked: a zygote can
    fork or send cold each rank once (torchrun restarts none), and forked nothing if unused."""
    yield RECEIPT_NAME, f"{where}.used", zygote.used, zygote.forked > 0
    within = zygote.forked + zygote.sent_cold <= ranks
    yield RECEIPT_NAME, f"{where}: forked + sent_cold <= its {ranks} rank(s)", within, True
    if len(starts) == ranks and all(s is not None for s in starts):
        forked = sum(s is not None and s.forked for s in starts)
        yield RECEIPT_NAME, f"{where}.forked (records: forked)", zygote.forked, forked


# (the rank record's outcome, its JUnit report's) where the report counts the test better: a
# failure hidden, or a skip counted as a pass (the tallies, and so the verdict, come from the
# reports; the rank plugin writes both from one outcome).
_BETTER_IN_JUNIT = frozenset(
    {
        ("failed", "passed"),
        ("failed", "skipped"),
        ("error", "passed"),
        ("error", "skipped"),
        ("skipped", "passed"),
    }
)


_FAILING = frozenset({"failed", "error"})
# The node id a rank records for a collection error of the session itself, which pytest's
# JUnit report names otherwise (it fails the run anyway: no test passes).
SESSION_COLLECTION = "<collection>"


def junit_record_problems(derived: Derived) -> list[str]:
    """One line per rank whose own JUnit report counts a test better than its rank record does
    (the first such test): a report edited alone cannot turn the records' skips into passes,
    which the tallies count, nor their failures into anything else, nor pass a test the rank
    never collected or never reported an outcome for (the session ended first), nor leave out
    a test the record has an outcome for (a failure dropped from the report is one the
    tallies, and so the verdict, never see)."""
    problems = []
    by_rank: dict[int, list[Case]] = {}
    for case in derived.merged.cases:
        if case.source == "junit":
            by_rank.setdefault(case.rank, []).append(case)
    for rank, record in sorted(derived.rank_files.records.items()):
        if rank in derived.merged.missing:
            continue  # no report was read: its cases were rebuilt from this record
        problem = _report_problem(rank, record, by_rank.get(rank, []))
        if problem is not None:
            problems.append(problem)
    return problems


def _report_problem(rank: int, record: RankRecord, cases: list[Case]) -> str | None:
    """The first way rank `rank`'s JUnit report (`cases`) counts a test better than `record`."""
    recorded = {mangle(t.nodeid): t for t in record.tests}
    collected = {mangle(n) for n in record.collected}
    report = junit_path(Path(), rank).as_posix()
    record_file = rank_record_path(Path(RECORDS_DIR), rank).as_posix()
    for case in cases:
        test = recorded.get((case.classname, case.name))
        if test is not None and (test.outcome, case.outcome) in _BETTER_IN_JUNIT:
            return (
                f"{report}: {test.nodeid} is {case.outcome} where {record_file} says {test.outcome}"
            )
        if case.outcome == "passed" and test is None:  # a test the rank never ran here
            key = (case.classname, case.name)
            said = "has no outcome for it" if key in collected else "names no such test"
            return f"{report}: {case.classname}::{case.name} is passed, but {record_file} {said}"
    reported = {(case.classname, case.name) for case in cases}
    for test in sorted(record.tests, key=lambda t: t.outcome not in _FAILING):  # worst first
        if test.nodeid != SESSION_COLLECTION and mangle(test.nodeid) not in reported:
            return (
                f"{report}: has no case of {test.nodeid}, which {record_file} says {test.outcome}"
            )
    return None


def rederive_problems(bundle: Path, receipt: Receipt, derived: Derived | None = None) -> list[str]:
    """One line per receipt field that the bundle's own records contradict (`derived`:
    `derive_stated` of this bundle and receipt, where the caller has it already)."""
    if derived is None:
        derived = derive_stated(bundle, receipt)
    problems = junit_record_problems(derived)
    for holder, field, mine, theirs in derived_facts(bundle, receipt, derived):
        found = first_difference(field, mine, theirs)
        if found is not None:
            problems.append(found.describe(holder))
    return problems
