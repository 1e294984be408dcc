"""summary.md's layout from bundles the evidence factory writes: lazy events as one rank x
detector table (not a bullet per rank), what did not run grouped and weighed, the target
geometry named when the run had it, and a forged skip count caught by verify."""

from __future__ import annotations

import socket
from pathlib import Path

from _support.evidence_factory import (
    capture,
    context,
    control,
    passing_run,
    write_rank,
)

from harness.capture.events import LazyEvent
from harness.evidence.collect import coverage_of, load_records
from harness.evidence.verify import _check_consistency
from harness.evidence.writer import finalize_bundle


def test_lazy_events_on_every_rank_are_one_rank_by_detector_table(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    world = 8
    for rank in range(world):
        events = [
            LazyEvent("transport-registry", rank, "created transport 16 heads x 576 -> 512"),
            LazyEvent("dynamo", rank, "compiled step"),
        ]
        write_rank(out, rank, world, captures=[capture(rank, events=events), control(rank)])
    finalize_bundle(out, context(world))
    summary = (out / "summary.md").read_text()
    failures = summary.split("## Failures")[1].split("## What did not run")[0]
    assert "| rank | dynamo | transport-registry |" in failures
    assert all(f"| {rank} | 1 | 1 |" in failures for rank in range(world))
    # the root cause and its failed test say it; no line per rank repeats it
    assert failures.count("created transport") == 2


def test_what_did_not_run_is_grouped_and_the_heaviest_comes_first(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    finalize_bundle(out, passing_run(out))
    summary = (out / "summary.md").read_text()
    not_run = summary.split("## What did not run")[1].split("## Run")[0]
    machine = not_run.index("### Not run on this machine")
    shims = not_run.index("### Shims and stand-ins")
    scope = not_run.index("### Out of scope")
    assert machine < shims < scope < not_run.index("- multi-node:")
    assert not_run.index("- gpu-capture:") < not_run.index("- nccl:") < not_run.index("- image:")
    assert not_run.index("- real-trees:") > shims


def test_the_target_geometry_is_named_and_no_host_is_printed(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    finalize_bundle(out, passing_run(out, world=16))
    head = (out / "summary.md").read_text().split("```")[0]
    assert "TP16 / DCP16: the target geometry (Kimi-K3 TP16 / DCP16 on 16 ranks)" in head
    assert "not the target" not in head
    summary = (out / "summary.md").read_text()
    assert socket.gethostname() not in summary and "host " not in summary


def test_verify_refuses_skip_reasons_that_merged_xml_does_not_say(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    receipt = finalize_bundle(out, passing_run(out))
    coverage = coverage_of(load_records(out, 4))
    assert not [p for p in _check_consistency(out, receipt, coverage) if "skip_reasons" in p]
    forged = receipt.model_copy(update={"skip_reasons": {"needs 16 ranks": 3}})
    problems = _check_consistency(out, forged, coverage)
    assert any("skip_reasons are {'needs 16 ranks': 3}" in p for p in problems), problems


def test_list_reprs_read_as_prose_but_test_ids_keep_their_brackets() -> None:
    from harness.evidence.summary import prose

    assert prose("ranks [0, 2, 3] did not finish (killed [])") == (
        "ranks 0, 2 and 3 did not finish (killed none)"
    )
    assert prose("the first: suites/a.py::test_x[1]") == "the first: suites/a.py::test_x[1]"
