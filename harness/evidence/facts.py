"""What the rank records and JUnit reports of an out folder say, read once and the same way.

The writer fills a receipt from these facts and `dcpqual verify` re-derives them from the
bundle to hold the receipt to them; both call `rank_facts`, so the two cannot drift apart by
reading the files differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.evidence.collect import (
    RankFiles,
    coverage_of,
    load_records,
    merge_signatures,
    model_sources,
    rank_hosts,
    selection_of,
    summarize_capture,
    transports,
)
from harness.evidence.junit import MergedJUnit, merge_junit, skip_reasons, tallies
from harness.schema.receipt import (
    Capture,
    Coverage,
    Models,
    NegativeControl,
    Ranks,
    Run,
    Selection,
    SignatureRow,
    Tally,
)


@dataclass(frozen=True)
class RankFacts:
    """The records' facts, plus the launcher's `run` (no file in the folder records it), so
    the failure rules (`rules.failure_reasons_of`) take this value as they take a receipt."""

    rank_files: RankFiles
    merged: MergedJUnit
    suites: dict[str, Tally]
    skip_reasons: dict[str, int]
    capture: Capture
    negative_control: NegativeControl
    signatures: list[SignatureRow]
    ranks: Ranks
    coverage: Coverage | None
    transports: list[str]
    selection: Selection | None
    models: Models  # vLLM's real trees the ranks built
    hosts: list[str]  # the hostnames the ranks ran on
    run: Run


def rank_facts(
    out_dir: Path,
    world_size: int,
    run: Run,
    rank_files: RankFiles | None = None,
    *,
    runner_cases: bool = False,
) -> RankFacts:
    """Read `records/rank-NN.json` and `junit/rank-NN.xml` of ranks 0..world_size-1
    (`rank_files`: the records, where the caller has read them already; `runner_cases`: count
    the runner's own cases of ranks that left nothing in the tallies, as receipts written
    before `skip_reasons` did)."""
    rank_files = load_records(out_dir, world_size) if rank_files is None else rank_files
    merged = merge_junit(out_dir, rank_files)
    capture, negative = summarize_capture(rank_files)
    return RankFacts(
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
        hosts=rank_hosts(rank_files),
        run=run,
    )
