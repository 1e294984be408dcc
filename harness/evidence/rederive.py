"""Re-derive a receipt's facts from the rank records and JUnit reports the bundle holds.

A receipt is a summary of files that are themselves in the bundle and covered by its hashes:
`records/rank-NN.json` and `junit/rank-NN.xml`. `dcpqual verify` reads them again with the
same readers the writer used and rejects a receipt that says anything else about them, so an
edited receipt cannot claim fewer lazy events, a flipped verdict, fewer killed ranks, other
tallies or other signatures, even with every hash regenerated: it would have to edit the
records consistently too (only a signature protects against that; see the README).

The geometry is held to the records too: every record names its world size, backend, warm
code, node and local rank, and (since records name them) the tp and dcp its suites qualified,
so a receipt cannot claim NCCL, more nodes, another TP/DCP or another layout than the ranks ran
with (and so drop the limitations those would require). What the ranks' pytest was told to
select is held to the records too, so a narrowed run cannot drop its `selection` limitation,
and so are the real vLLM trees the ranks built (`models`, which the real-tree limitations follow
from), the hosts they ran on (`environment.hosts`), the image digest their environment named
and the harness checkout rank 0 ran (`image.digest`, `sources.dcpqual`).

Coverage, the failed-test list and the rootdir are held to the records whatever the receipt
states: a receipt without them (from before they were recorded, or with them dropped) fails,
so dropping one cannot switch its check off.

Not re-derived, because no rank file records it: the run's exit code and timeout (the
launcher's view; verify holds them to the launcher's record of the launch, and that record to
the bundle's launch.json and node markers), tp and dcp of records that predate them, the rest
of the environment (GPUs, driver, NCCL), the image's runtime check and the peers' versions, and
the root cause's text (it may quote torchrun's error file). The root cause's rank, test and
kind are re-derived whenever the records name a cause, whatever kind the receipt gives it (not
for an interrupted run, whose cause verify holds to the launcher's record of the interruption,
nor for the fallbacks to torchrun's error file, JUnit or the verdict's reasons).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.evidence import rules
from harness.evidence.collect import RankFiles, find_root_cause, hash_seed_of
from harness.evidence.ending import failed_tests, ranks_rootdir
from harness.evidence.facts import rank_facts
from harness.evidence.junit import read_merged, tallies
from harness.evidence.sources import recorded_harness
from harness.schema.launch import ZygoteState
from harness.schema.layout import RECEIPT_NAME
from harness.schema.rank_record import RankRecord, RankStart
from harness.schema.receipt import Receipt

MERGED_JUNIT = "junit/merged.xml"
SOURCE = "the rank records and JUnit reports"


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


def derived_facts(
    bundle: Path, receipt: Receipt, rank_files: RankFiles | None = None
) -> Iterator[tuple[str, str, Any, Any]]:
    """(file, field, its value, re-derived value) as JSON, in the order they are reported
    (`rank_files`: the bundle's records, where the caller has read them already).

    Tallies are checked on junit/merged.xml, which verify already holds the receipt's tallies
    to: each fact is checked once, where it is first stated.
    """
    facts = rank_facts(
        bundle,
        receipt.geometry.world_size,
        receipt.run,
        rank_files,
        runner_cases=receipt.skip_reasons is None,  # written before: counted them as tests
    )
    rank_files = facts.rank_files
    reasons = rules.failure_reasons_of(facts)

    def dump(value: Any) -> Any:
        if isinstance(value, list):
            return [dump(v) for v in value]
        if isinstance(value, dict):
            return {str(k): dump(v) for k, v in value.items()}
        if hasattr(value, "model_dump"):
            return value.model_dump(mode="json")
        return value

    r = RECEIPT_NAME
    yield from _geometry_facts(receipt, rank_files)
    yield r, "verdict", receipt.verdict, rules.verdict_of(reasons)
    yield r, "ranks", dump(receipt.ranks), dump(facts.ranks)
    try:
        stated = tallies(
            read_merged(bundle / MERGED_JUNIT), runner_cases=receipt.skip_reasons is None
        )
    except (OSError, ValueError):
        pass  # an unreadable merged.xml is reported by verify's consistency check
    else:
        yield MERGED_JUNIT, "suites", dump(stated), dump(facts.suites)
    yield r, "coverage", dump(receipt.coverage), dump(facts.coverage)
    yield r, "capture", dump(receipt.capture), dump(facts.capture)
    yield r, "negative_control", dump(receipt.negative_control), dump(facts.negative_control)
    yield r, "signatures", dump(receipt.signatures), dump(facts.signatures)
    yield r, "transports", receipt.transports, facts.transports
    yield r, "selection", dump(receipt.selection), dump(facts.selection)
    yield r, "models", dump(receipt.models), dump(facts.models)
    yield r, "environment.hosts", receipt.environment.hosts, facts.hosts
    yield from _launch_facts(receipt, rank_files)
    yield from _provenance_facts(receipt, rank_files, dump)
    yield from _ending_facts(receipt, rank_files, dump)
    yield r, "failures", receipt.failures, reasons  # last: it sums up the facts above


def _one(values: Iterator[Any]) -> Any:
    """The single value every record states, or all the different ones, sorted."""
    distinct = sorted(set(values), key=repr)
    return distinct[0] if len(distinct) == 1 else distinct


def _geometry_facts(receipt: Receipt, rank_files: RankFiles) -> Iterator[tuple[str, str, Any, Any]]:
    """World size, backend, warm code and each rank's place (torchrun numbers the ranks of
    node n as n x nproc_per_node + local rank) as the records that exist state them."""
    records = rank_files.records
    if not records:
        return  # nothing to hold the receipt to: the ranks check already reports them killed
    g, r = receipt.geometry, RECEIPT_NAME
    yield r, "geometry.world_size", g.world_size, _one(x.world_size for x in records.values())
    yield r, "geometry.backend", g.backend, _one(x.backend for x in records.values())
    yield r, "warm_impl", receipt.warm_impl, _one(x.warm_impl for x in records.values())
    for name in ("tp", "dcp"):  # records written before they named their degrees do not
        if any(getattr(x, name) is not None for x in records.values()):
            derived = _one(getattr(x, name) for x in records.values())
            yield r, f"geometry.{name}", getattr(g, name), derived
    for rank, record in sorted(records.items()):
        stated = f"node {rank // g.nproc_per_node}, local rank {rank % g.nproc_per_node}"
        placed = f"node {record.node_rank}, local rank {record.local_rank}"
        yield r, f"geometry: place of rank {rank}", stated, placed


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


def _provenance_facts(
    receipt: Receipt, rank_files: RankFiles, dump: Callable[[Any], Any]
) -> Iterator[tuple[str, str, Any, Any]]:
    """The image the run was in and the harness checkout it ran, held to what the ranks saw at
    their start (records that predate it say nothing): a receipt cannot claim a locked image
    its ranks did not run in, or a clean checkout rank 0 saw dirty, to gain `qualified`."""
    seen = {r: x.provenance for r, x in rank_files.records.items() if x.provenance is not None}
    if not seen:
        return
    stated = None if receipt.image is None else receipt.image.digest
    yield RECEIPT_NAME, "image.digest", stated, _one(p.image_digest for p in seen.values())
    zero = seen.get(0)
    if zero is None and 0 in rank_files.records:  # the one record that names the checkout
        others = sorted(seen)
        yield RECEIPT_NAME, "rank 0's provenance", None, f"recorded, as ranks {others} record it"
    if zero is not None:
        harness = receipt.sources.get("dcpqual")
        derived = recorded_harness(zero, None if harness is None else harness.version)
        yield RECEIPT_NAME, "sources.dcpqual", dump(harness), dump(derived)


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


def _ending_facts(
    receipt: Receipt, rank_files: RankFiles, dump: Callable[[Any], Any]
) -> Iterator[tuple[str, str, Any, Any]]:
    """The root cause, the failed-test list (what `--rerun-failed` reruns) and the rootdir its
    node ids are relative to. The list is held to the records with the stated root cause (whose
    text is not re-derived), so an emptied list cannot hide the failures. An interrupted run's
    cause is the interruption, held by verify to the launcher's record of it; any other cause
    the records name is the receipt's, even one that calls itself an interruption."""
    cause = receipt.root_cause
    launcher_cause = receipt.run.extra.interrupted or receipt.run.extra.node_zero_gone
    if cause is not None and launcher_cause is None:
        derived_cause = find_root_cause(
            rank_files, timed_out=receipt.run.timed_out, torchrun_error=None
        )
        if derived_cause is not None:
            keys = ("rank", "test", "kind")
            yield (
                RECEIPT_NAME,
                "root_cause",
                {k: getattr(cause, k) for k in keys},
                {k: getattr(derived_cause, k) for k in keys},
            )
    derived = failed_tests(rank_files, receipt.root_cause)
    yield RECEIPT_NAME, "failed_tests", dump(receipt.failed_tests), dump(derived)
    yield RECEIPT_NAME, "run.rootdir", receipt.run.rootdir, ranks_rootdir(rank_files)


def rederive_problems(
    bundle: Path, receipt: Receipt, rank_files: RankFiles | None = None
) -> list[str]:
    """One line per receipt field that the bundle's own records contradict."""
    problems = []
    for holder, field, mine, theirs in derived_facts(bundle, receipt, rank_files):
        found = first_difference(field, mine, theirs)
        if found is not None:
            problems.append(found.describe(holder))
    return problems
