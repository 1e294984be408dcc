"""A skip is a path that did not run: a test skipped on every rank proved nothing, and one that
ran on some ranks only was agreed on without the others. Neither fails a run, so the receipt
counts both from the rank records and requires a `skipped` limitation that names the first of
each; verify holds the counts to the records and the limitation to the counts. A sub-world case
that another lane ran is recorded as a skip on the other ranks and is none of this."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import (
    GPU_DIGEST,
    NODES,
    SIGNATURE_TEST,
    context,
    gpu_run,
    passed,
    torchrun_logs,
    write_rank,
)
from _support.forge import forge

from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle
from harness.schema.rank_record import ELSEWHERE_SKIP, TestOutcome
from harness.schema.receipt import Receipt

HELD_OUT = "suites/capture/test_held_out_geometry.py::test_kimi_capture_has_no_lazy_work"
LANE_CASE = "suites/transport/test_combine.py::test_dcp2[case0]"


def skipped(nodeid: str, message: str | None = None) -> TestOutcome:
    return TestOutcome(nodeid=nodeid, outcome="skipped", message=message)


def ran_elsewhere(nodeid: str, rank: int) -> TestOutcome:
    """How the harness records a sub-world case that lane 0 ran, on a rank of another lane."""
    message = f"{ELSEWHERE_SKIP}lane 0 (ranks 0-1), not on rank {rank}"
    return TestOutcome(nodeid=nodeid, outcome="skipped", message=message, elsewhere=True)


def _bundle(out: Path, per_rank: dict[int, list[TestOutcome]]) -> Path:
    out.mkdir()
    world = len(per_rank)
    for rank, extra in per_rank.items():
        tests = [passed(n) for n in NODES] + extra
        write_rank(out, rank, world, tests=tests, collected=[*NODES, *(t.nodeid for t in extra)])
    torchrun_logs(out, world)
    finalize_bundle(out, context(world))
    return out


def _receipt(out: Path) -> Receipt:
    return Receipt.model_validate_json((out / "receipt.json").read_bytes())


def _limitation(out: Path) -> str | None:
    receipt = _receipt(out)
    found = [x for x in receipt.limitations if x.startswith("skipped: ")]
    return found[0] if found else None


def test_a_test_skipped_on_every_rank_is_named_and_the_run_still_passes(tmp_path: Path) -> None:
    out = _bundle(tmp_path / "b", {0: [skipped(HELD_OUT)], 1: [skipped(HELD_OUT)]})
    receipt = _receipt(out)
    assert receipt.verdict == "pass"
    assert receipt.coverage is not None
    assert (receipt.coverage.skipped_everywhere, receipt.coverage.skipped_on_some_ranks) == (1, 0)
    assert _limitation(out) == (
        f"skipped: 1 test(s) skipped on every rank, so they proved nothing (the first: {HELD_OUT})"
    )
    assert verify_bundle(out).ok, verify_bundle(out).problems


def test_a_test_that_ran_on_some_ranks_only_names_both_sets_of_ranks(tmp_path: Path) -> None:
    ranks = {r: [passed(HELD_OUT) if r in (0, 1, 3) else skipped(HELD_OUT)] for r in range(4)}
    out = _bundle(tmp_path / "b", ranks)
    assert _limitation(out) == (
        "skipped: 1 test(s) skipped on some ranks and ran on others (the first: "
        f"{HELD_OUT} (skipped on ranks [2], ran on ranks [0-1, 3]))"
    )
    assert verify_bundle(out).ok


def test_a_sub_world_case_another_lane_ran_is_not_a_skip(tmp_path: Path) -> None:
    ranks = {
        0: [passed(LANE_CASE)],
        1: [passed(LANE_CASE)],
        2: [ran_elsewhere(LANE_CASE, 2)],
        3: [ran_elsewhere(LANE_CASE, 3)],
    }
    out = _bundle(tmp_path / "b", ranks)
    assert _limitation(out) is None
    assert verify_bundle(out).ok


def test_a_sub_world_case_its_own_lane_skipped_is_skipped_everywhere(tmp_path: Path) -> None:
    ranks = {
        0: [skipped(LANE_CASE)],
        1: [skipped(LANE_CASE)],
        2: [ran_elsewhere(LANE_CASE, 2)],
        3: [ran_elsewhere(LANE_CASE, 3)],
    }
    out = _bundle(tmp_path / "b", ranks)
    assert _limitation(out) is not None and "skipped on every rank" in str(_limitation(out))


def test_a_test_s_own_skip_worded_like_a_lane_s_is_still_a_skip(tmp_path: Path) -> None:
    """Only the harness marks a case as run elsewhere; a test cannot hide its one-rank run by
    skipping with the harness's wording."""
    own = skipped(HELD_OUT, f"{ELSEWHERE_SKIP}lane 0 (ranks 0-0), not on rank 1")
    out = _bundle(tmp_path / "b", {0: [passed(HELD_OUT)], 1: [own]})
    assert "skipped on some ranks and ran on others" in str(_limitation(out))


def test_a_forger_who_drops_the_limitation_is_caught(tmp_path: Path) -> None:
    out = _bundle(tmp_path / "b", {0: [skipped(HELD_OUT)], 1: [skipped(HELD_OUT)]})

    def drop(data: dict[str, Any]) -> None:
        data["limitations"] = [x for x in data["limitations"] if not x.startswith("skipped: ")]

    forge(out, drop)
    assert "limitations do not name 'skipped'" in " ".join(verify_bundle(out).problems)


def test_a_forger_who_also_zeroes_the_counts_is_caught_by_the_records(tmp_path: Path) -> None:
    out = _bundle(tmp_path / "b", {0: [skipped(HELD_OUT)], 1: [passed(HELD_OUT)]})

    def hide(data: dict[str, Any]) -> None:
        data["limitations"] = [x for x in data["limitations"] if not x.startswith("skipped: ")]
        data["coverage"].update(skipped_on_some_ranks=0, first_skipped_on_some_ranks=None)

    forge(out, hide)
    problems = " ".join(verify_bundle(out).problems)
    assert "coverage.first_skipped_on_some_ranks is None but the rank records" in problems


def test_a_forger_who_drops_the_coverage_cannot_claim_qualified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU run that earns `qualified` but for a test skipped on every rank: without its
    coverage the receipt still owes the `skipped` limitation, required from the records' own
    coverage, and the coverage it dropped is named."""
    out = tmp_path / "b"
    tests = [skipped(SIGNATURE_TEST, "no GPU of sm_12x"), *(passed(n) for n in NODES[1:])]
    written = gpu_run(out, monkeypatch, tests=tests)
    assert written.status == "source-qualified" and "skipped" in written.limitation_keys()
    assert verify_bundle(out).ok, verify_bundle(out).problems

    def forget(data: dict[str, Any]) -> None:
        data["coverage"] = None
        data["limitations"] = [x for x in data["limitations"] if not x.startswith("skipped: ")]

    assert forge(out, forget).status == "qualified"
    assert verify_bundle(out).problems == (
        "receipt.json: status qualified is not allowed here: a pass run on nccl, 4 GPUs, image "
        f"digest {GPU_DIGEST}, capture paths {{'cuda-graph': 4}} is source-qualified "
        "(limitations that deny qualified: skipped)",
        "receipt.json: limitations do not name 'skipped': 1 test(s) skipped on every rank, so "
        f"they proved nothing (the first: {SIGNATURE_TEST})",
        "receipt.json: coverage is None but the rank records and JUnit reports say "
        "{'collected': 4, 'without_outcome': 0, 'first_without_outcome': None, "
        "'skipped_everywhere': 1, 'first_skipped_everywhere': "
        "'suites/warm/test_signatures.py::t...",
    )
