"""Derive a receipt's facts from what a run's out folder holds, once, for the writer and verify.

`derive` reads `records/rank-NN.json` and `junit/rank-NN.xml` and returns every receipt fact
they determine: tallies, skip reasons, capture, negative control, signatures, ranks, coverage,
transports, selection, real trees, hosts, the pytest rootdir, the failure reasons and the
verdict they give, the root cause, the failed-test list and the harness checkout rank 0 ran.
The writer fills the receipt from this value; `dcpqual verify` calls it again on the bundle
(whose files the hashes cover) and holds the receipt to it field by field
(harness.evidence.rederive). One derivation, so the two cannot drift apart by computing a fact
differently.

Some of the receipt no rank file records; the caller passes it in: the launcher's `run` (its
command, exit code, timeout and the record of its launch, which the failure rules read), the
geometry, warm code and image, torchrun's error file (the root cause falls back to it, and
quotes it) and the installed harness version. The writer passes what the launcher saw; verify
passes what the receipt states and the bundle's copy of torchrun's error files, so for verify
the root cause is the records' only where the records name one (`records_cause`), and the
failed-test list is derived with the receipt's own root cause (`failed_tests_for`).

The geometry, warm code and image are carried through unchanged, not taken from the records:
the records cannot say how many ranks left none, nor which image a killed rank was in. The
records that exist corroborate them instead, and the root cause's rank, test and kind where
they name a cause (`Derived.corroborations`). Verify reports each fact they contradict
(harness.evidence.rederive); in bundles of the earlier fork server, each node's zygote is held
to its ranks there too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.evidence import rules
from harness.evidence.collect import (
    RankFiles,
    coverage_of,
    find_root_cause,
    hash_seeds_of,
    load_records,
    merge_signatures,
    model_sources,
    rank_hosts,
    selection_of,
    summarize_capture,
    transports,
)
from harness.evidence.files import walk
from harness.evidence.junit import MergedJUnit, merge_junit, skip_reasons, tallies
from harness.evidence.run_context import TorchrunFailure
from harness.evidence.short_summary import failed_tests, ranks_rootdir
from harness.evidence.sources import recorded_harness
from harness.schema.image import Image
from harness.schema.layout import STACKS_DIR, rank_file_name
from harness.schema.rank_record import RankRecord
from harness.schema.receipt import (
    Capture,
    Coverage,
    FailedTest,
    Geometry,
    HashSeed,
    Models,
    NegativeControl,
    Ranks,
    RootCause,
    Run,
    Selection,
    SignatureRow,
    Source,
    Tally,
    Verdict,
)

# Root-cause kinds that do not come from the rank records: the launcher's record of an
# interruption or of node 0's death, and the fallbacks when no record names a cause.
NOT_FROM_RECORDS = frozenset({"interrupted", "node-gone", "torchrun", "junit", "run"})
# What the records say of a root cause where none of them names one.
NO_RECORDED_CAUSE = "no cause: no rank record names a failure"
# What the bundle says of a cause torchrun reported where it holds no torchrun error file.
NO_TORCHRUN_CAUSE = "no cause: no torchrun error file in the bundle"


@dataclass(frozen=True)
class Corroboration:
    """One of the launcher's facts (`stated`) and what the rank records that exist say of it
    (`recorded`), as JSON values; they agree when equal."""

    field: str
    stated: Any
    recorded: Any


@dataclass(frozen=True)
class Derived:
    """The receipt's facts as the out folder's records and reports give them, plus the
    launcher's `run` (no file in the folder records it), so the failure rules
    (`rules.failure_reasons_of`) take this value as they take a receipt."""

    rank_files: RankFiles
    merged: MergedJUnit
    suites: dict[str, Tally]
    skip_reasons: dict[str, int]
    capture: Capture
    negative_control: NegativeControl
    signatures: list[SignatureRow]
    ranks: Ranks
    coverage: Coverage
    transports: list[str]
    selection: Selection | None
    models: Models  # vLLM's real trees the ranks built
    hash_seeds: list[HashSeed] | None  # the string-hash seeds the ranks started with
    hosts: list[str]  # the hostnames the ranks ran on
    rootdir: str | None  # the pytest rootdir the ranks report (`run.rootdir`)
    harness: Source | None  # `sources.dcpqual` as rank 0 recorded it; None: its record does not
    run: Run
    # The launcher's, carried through (see the module docstring): `corroborations` holds them
    # to the records.
    geometry: Geometry
    warm_impl: str
    image: Image | None
    # The earliest failure the records and the launcher's facts show, whatever the verdict:
    # the receipt's root cause when the run fails (`root_cause`).
    earliest: RootCause | None = None

    @cached_property
    def failures(self) -> list[str]:
        return rules.failure_reasons_of(self)

    @property
    def verdict(self) -> Verdict:
        return rules.verdict_of(self.failures)

    @property
    def root_cause(self) -> RootCause | None:
        """The receipt's root cause: None for a pass."""
        return None if self.verdict == "pass" else self.earliest

    @property
    def records_cause(self) -> RootCause | None:
        """The earliest failure where the rank records name it (not the launcher's record of an
        interruption or of node 0's death, nor a fallback), whatever the verdict."""
        cause = self.earliest
        return None if cause is None or cause.kind in NOT_FROM_RECORDS else cause

    @property
    def failed_tests(self) -> list[FailedTest]:
        """The receipt's failed-test list, its root cause's test first."""
        return self.failed_tests_for(self.root_cause)

    def failed_tests_for(self, root_cause: RootCause | None) -> list[FailedTest]:
        """The failed-test list (what `--rerun-failed` reruns) with `root_cause` first."""
        return failed_tests(self.rank_files, root_cause)

    @property
    def receipt_run(self) -> Run:
        """The receipt's `run`: the launcher's, with the rootdir the ranks report."""
        return self.run.model_copy(update={"rootdir": self.rootdir})

    def corroborations(self, root_cause: RootCause | None) -> Iterator[Corroboration]:
        """The launcher's facts held to what the records that exist say of them, in the order
        they are reported (`root_cause`: the one stated with them; the writer's is its own).

        The launcher knew these and the records can only confirm them: a record says where its
        own rank ran and in which image, not how many ranks left none. So a receipt cannot
        claim NCCL, more nodes, another TP/DCP, warm code or place than the ranks ran with (and
        drop the limitations those would require), a locked image they did not run in, or a
        root cause at another rank, test or kind than the records name, even one that calls
        itself an interruption (verify holds a real one to the launcher's record of it), nor a
        rank's test or death (a kind only the records give) where they name no cause, nor a
        cause torchrun reported at another rank than its error file names, or without one.
        Records that predate a fact (tp, dcp, provenance) say nothing of it.
        """
        records = self.rank_files.records
        if records:  # none: nothing to hold these to; the ranks check reports them killed
            yield from self._launcher_facts(records)
        # held even where no rank left a record: that they left none names the cause
        yield from self._root_cause_facts(root_cause)

    def _launcher_facts(self, records: dict[int, RankRecord]) -> Iterator[Corroboration]:
        """The geometry, warm code and image held to the `records` that exist."""
        g = self.geometry
        yield Corroboration("geometry.world_size", g.world_size, _one(records, "world_size"))
        yield Corroboration("geometry.backend", g.backend, _one(records, "backend"))
        yield Corroboration("warm_impl", self.warm_impl, _one(records, "warm_impl"))
        for name in ("tp", "dcp"):
            if any(getattr(x, name) is not None for x in records.values()):
                yield Corroboration(f"geometry.{name}", getattr(g, name), _one(records, name))
        for rank, record in sorted(records.items()):  # torchrun: node x nproc_per_node + local
            stated = f"node {rank // g.nproc_per_node}, local rank {rank % g.nproc_per_node}"
            placed = f"node {record.node_rank}, local rank {record.local_rank}"
            yield Corroboration(f"geometry: place of rank {rank}", stated, placed)
        seen = {r: x.provenance for r, x in records.items() if x.provenance is not None}
        if seen:
            digest = None if self.image is None else self.image.digest
            recorded = _distinct(p.image_digest for p in seen.values())
            yield Corroboration("image.digest", digest, recorded)
            if 0 in records and 0 not in seen:  # the one record that names the checkout
                recorded_by = f"recorded, as ranks {sorted(seen)} record it"
                yield Corroboration("rank 0's provenance", None, recorded_by)

    def _root_cause_facts(self, root_cause: RootCause | None) -> Iterator[Corroboration]:
        """The stated root cause's rank, test, kind and message held to the cause the records
        name (or torchrun's error file, for a cause the receipt says torchrun reported)."""
        if root_cause is None:
            return
        keys = ("rank", "test", "kind")
        stated = {k: getattr(root_cause, k) for k in keys}
        cause = self.records_cause
        if cause is not None:
            yield from _same_cause(root_cause, cause)
        elif root_cause.kind not in NOT_FROM_RECORDS and not self._launcher_cause:
            # a kind only the records give (a rank's test, its death) where they give none
            yield Corroboration("root_cause", stated, NO_RECORDED_CAUSE)
        elif root_cause.kind == "torchrun":  # held to the error file it says torchrun wrote
            earliest = self.earliest
            if earliest is not None and earliest.kind == "torchrun":
                yield from _same_cause(root_cause, earliest)
            else:
                yield Corroboration("root_cause", stated, NO_TORCHRUN_CAUSE)
        elif self.earliest is not None and not self._launcher_cause:
            # a fallback (JUnit, the verdict's first reason) is the one the bundle gives: not
            # torchrun's error file called a mere exit code, nor a reason reworded
            yield from _same_cause(root_cause, self.earliest)

    @property
    def _launcher_cause(self) -> bool:
        """Whether the earliest failure is the launcher's record of an interruption or of node
        0's death: verify holds the stated cause to that record instead."""
        return self.earliest is not None and self.earliest.kind in ("interrupted", "node-gone")


def _same_cause(stated: RootCause, derived: RootCause) -> Iterator[Corroboration]:
    """The stated cause's rank, test and kind, then, where those agree, its message (what the
    summary's verdict line quotes): the derived cause's, so a failure cannot be reworded as,
    say, an infrastructure flake."""
    keys = ("rank", "test", "kind")
    mine = {k: getattr(stated, k) for k in keys}
    theirs = {k: getattr(derived, k) for k in keys}
    yield Corroboration("root_cause", mine, theirs)
    if mine == theirs:
        yield Corroboration("root_cause.message", stated.message, derived.message)


def _one(records: dict[int, RankRecord], name: str) -> Any:
    """The single value of `name` every record states, or all the different ones, sorted."""
    return _distinct(getattr(x, name) for x in records.values())


def _distinct(values: Iterable[Any]) -> Any:
    distinct = sorted(set(values), key=repr)
    return distinct[0] if len(distinct) == 1 else distinct


def derive(
    out_dir: Path,
    geometry: Geometry,
    run: Run,
    *,
    warm_impl: str,
    image: Image | None,
    runner_cases: bool = False,
    torchrun_error: TorchrunFailure | None = None,
    harness_version: str | None = None,
) -> Derived:
    """Read `records/rank-NN.json` and `junit/rank-NN.xml` of the geometry's ranks and derive
    the receipt's facts (`runner_cases`: count the runner's own cases of ranks that left nothing
    in the tallies, as receipts written before `skip_reasons` did; `geometry`, `run`,
    `warm_impl`, `image`, `torchrun_error`, `harness_version`: the launcher's facts, see the
    module docstring)."""
    world_size = geometry.world_size
    rank_files = load_records(out_dir, world_size)
    merged = merge_junit(out_dir, rank_files)
    capture, negative = summarize_capture(rank_files)
    zero = rank_files.records.get(0)
    provenance = None if zero is None else zero.provenance
    derived = Derived(
        rank_files=rank_files,
        merged=merged,
        suites=tallies(merged.cases, runner_cases=runner_cases),
        skip_reasons=skip_reasons(merged.cases),
        capture=capture,
        negative_control=negative,
        signatures=merge_signatures(rank_files.captures()),
        ranks=Ranks(
            expected=world_size,
            reported=len(rank_files.records),
            complete=rank_files.complete,
            killed=rank_files.killed,
            stopped=rank_files.stopped,
            missing_junit=list(merged.missing),
        ),
        coverage=coverage_of(rank_files),
        transports=transports(rank_files),
        selection=selection_of(rank_files),
        models=model_sources(rank_files),
        hash_seeds=hash_seeds_of(rank_files.records),
        hosts=rank_hosts(rank_files),
        rootdir=ranks_rootdir(rank_files),
        harness=None if provenance is None else recorded_harness(provenance, harness_version),
        run=run,
        geometry=geometry,
        warm_impl=warm_impl,
        image=image,
    )
    cause = find_root_cause(
        rank_files,
        timed_out=run.timed_out,
        torchrun_error=torchrun_error,
        junit_failures=merged.failures(),
        reasons=derived.failures,
        interrupted=None if run.extra.interrupted is None else run.extra.interrupted.message(),
        node_gone=(
            None
            if run.extra.node_zero_gone is None
            else rules.node_zero_gone_reason(run.extra.node_zero_gone)
        ),
    )
    return replace(derived, earliest=_with_stack_dump(out_dir, cause))


def _with_stack_dump(out_dir: Path, cause: RootCause | None) -> RootCause | None:
    """Point the root cause at the faulthandler dump of its rank, when the launcher left one. A
    `stacks` that is a link is not followed: verify derives from bundles it cannot trust, and
    reports the link itself."""
    stacks = out_dir / STACKS_DIR
    if cause is None or cause.rank is None or stacks.is_symlink() or not stacks.is_dir():
        return cause
    dumps = sorted(e.relpath for e in walk(stacks) if rank_file_name(cause.rank, "") in e.relpath)
    if not dumps:
        return cause
    where = ", ".join(f"stacks/{d}" for d in dumps)
    return cause.model_copy(update={"message": f"{cause.message} (stack dump: {where})"})
