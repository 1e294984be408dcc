"""No false pass, no forged receipt: real `dcpqual run` bundles at 2 ranks, then `verify`/`compare`.

- A suite whose every rank ends its session early with `pytest.exit(..., returncode=0)` ran one
  of three tests: the run fails, naming the first test without an outcome, and its bundle is a
  valid record of that failure.
- A real bundle whose receipt is edited (lazy events 0, killed ranks emptied, the verdict
  flipped) and then made self-consistent and resealed with the project's own functions fools
  every layer of verify but one: re-derivation from the rank records. `verify` says invalid and
  names the field; `compare` refuses the bundle (exit 2) instead of reporting no regression.
  Each forgery is first shown to pass verify with re-derivation switched off, so the test can
  only pass because that detector fires. The geometry (backend, nodes, warm code) and the
  failed-test list are held to the records too: claiming NCCL, two nodes or vLLM's warm code to
  drop a limitation, or emptying the list `--rerun-failed` reads, is invalid.
- A file added to the bundle and to SHA256SUMS, but not to the receipt's file list, is caught.
- A summary.md whose headline is changed to PASS, with only its SHA256SUMS line rewritten, is
  caught: verify renders the summary again from the receipt.
- A run narrowed by its pytest arguments (`--deselect`, `-k`, a target narrower than suites/)
  names that in its `selection` limitation, and a receipt cannot drop it (see the forgeries).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _support import forked_cli
from _support.forge import forge, reseal, restate_limitations

from harness.cli import main
from harness.evidence import verify

pytestmark = [pytest.mark.torchrun, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
WORLD = 2
DESELECTED = "tests/rank_suites/rank_pass.py::test_skipped_everywhere"
RUNS: dict[str, tuple[list[str], int]] = {
    # name: (dcpqual run arguments after the common ones, expected exit code)
    "early-exit": (["--", "tests/rank_suites/rank_early_exit.py"], 1),
    "killed": (["--", "tests/rank_suites/rank_exit.py"], 1),
    "pass": (["--", "tests/rank_suites/rank_pass.py", "--deselect", DESELECTED], 0),
}


def dcpqual(*argv: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DCPQUAL_FAULT_RANK": "1"}
    return forked_cli.run(argv, cwd=REPO, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, before_kimi_bundle: Path) -> dict[str, Path]:
    """The runs below, plus "lazy": the Kimi-K3 capture check with before-kimi's warm code
    (suites/capture/test_capture.py -k kimi), which fails on lazy work in capture."""
    root = tmp_path_factory.mktemp("integrity")
    out: dict[str, Path] = {"lazy": before_kimi_bundle}
    for name, (args, expected) in RUNS.items():
        out[name] = root / name
        common = ["run", "--nproc-per-node", str(WORLD), "--tp", str(WORLD), "--dcp", str(WORLD)]
        done = dcpqual(*common, "--out", str(out[name]), "--timeout", "300", *args)
        assert done.returncode == expected, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def receipt(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "receipt.json").read_text())


@pytest.fixture
def copy_of(runs: dict[str, Path], tmp_path: Path) -> Callable[[str], Path]:
    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(runs[name], target)
        return target

    return copy


# -- the verdict is derived from what ran ------------------------------------------------------


def test_a_session_ended_early_on_every_rank_fails_the_run(runs: dict[str, Path]) -> None:
    r = receipt(runs["early-exit"])
    assert r["verdict"] == "fail" and r["status"] == "not-qualified"
    assert r["run"]["exit_code"] == 0  # torchrun itself saw nothing wrong
    first = "tests/rank_suites/rank_early_exit.py::test_ends_the_session_early"
    assert r["coverage"]["collected"] == 3
    assert r["coverage"]["first_without_outcome"] == f"rank 0: {first}"
    assert r["root_cause"]["kind"] == "no-outcome" and r["root_cause"]["test"] == first
    assert any(f.startswith("4 collected tests have no outcome") for f in r["failures"])
    assert dcpqual("verify", str(runs["early-exit"])).returncode == 0


def test_a_run_that_selects_no_test_fails_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "none"
    args = ["run", "--nproc-per-node", str(WORLD), "--out", str(out), "--timeout", "300"]
    done = dcpqual(*args, "--", "tests/rank_suites/rank_pass.py", "-k", "no_such_test")
    assert done.returncode == 1, done.stderr[-2000:]
    r = receipt(out)
    assert r["verdict"] == "fail" and r["coverage"]["collected"] == 0
    assert r["failures"][0].startswith("no test was selected on any rank")
    assert r["root_cause"]["message"] == r["failures"][0]


def test_the_passing_run_is_still_a_valid_pass(runs: dict[str, Path]) -> None:
    r = receipt(runs["pass"])
    assert r["verdict"] == "pass" and r["coverage"]["without_outcome"] == 0
    assert dcpqual("verify", str(runs["pass"])).returncode == 0


# -- forged receipts ---------------------------------------------------------------------------


def no_lazy_events(data: dict[str, Any]) -> None:
    capture = data["capture"]
    capture.update(lazy_events=0, by_detector={}, events=[])
    capture["per_rank"] = dict.fromkeys(capture["per_rank"], 0)
    for row in data["signatures"]:
        row["warmed"] = True


def no_killed_ranks(data: dict[str, Any]) -> None:
    ranks = data["ranks"]
    ranks.update(reported=ranks["expected"], complete=ranks["expected"], killed=[], stopped=[])
    restate_limitations(data, "ranks")


def every_test_ran(data: dict[str, Any]) -> None:
    data["coverage"].update(without_outcome=0, first_without_outcome=None)


def without_limitation(data: dict[str, Any], key: str) -> None:
    data["limitations"] = [s for s in data["limitations"] if not s.startswith(f"{key}: ")]


def claims_nccl(data: dict[str, Any]) -> None:
    data["geometry"]["backend"] = "nccl"
    without_limitation(data, "nccl")


def claims_two_nodes(data: dict[str, Any]) -> None:
    data["geometry"].update(nnodes=WORLD, nproc_per_node=1)
    without_limitation(data, "multi-node")


def claims_vllm_warm_code(data: dict[str, Any]) -> None:
    data["warm_impl"] = "vllm"
    without_limitation(data, "warm-impl")


def no_failed_tests(data: dict[str, Any]) -> None:
    data["failed_tests"] = []


def claims_kimi_geometry(data: dict[str, Any]) -> None:
    """TP16/DCP16 on 2 ranks: the rank_pass suite has no capture, so no signature row says
    which DCP size ran; only the records' own tp and dcp do."""
    data["geometry"].update(tp=16, dcp=16)


def claims_smaller_dcp(data: dict[str, Any]) -> None:
    data["geometry"]["dcp"] = 1


def whole_selection(data: dict[str, Any]) -> None:
    data["selection"] = None
    without_limitation(data, "selection")


FORGERIES = [
    ("lazy", no_lazy_events, "capture.by_detector.transport-registry"),
    ("killed", no_killed_ranks, "ranks.complete"),
    ("early-exit", every_test_ran, "verdict"),
    ("pass", claims_nccl, "geometry.backend"),
    ("pass", claims_two_nodes, "geometry: place of rank 1"),
    ("pass", claims_vllm_warm_code, "warm_impl"),
    ("lazy", no_failed_tests, "failed_tests length"),
    ("pass", claims_kimi_geometry, "geometry.tp"),
    ("pass", claims_smaller_dcp, "geometry.dcp"),
    ("pass", whole_selection, "selection"),
]


def fooled_without_rederivation(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Verify would take the forgery if it did not read the bundle's own files again (the rank
    records, and the launch record a claimed second node would need)."""
    with monkeypatch.context() as patch:
        patch.setattr(verify, "rederive_problems", lambda *_: [])
        patch.setattr(verify, "launch_record_problems", lambda *_: [])
        return verify.verify_bundle(bundle).ok


@pytest.mark.parametrize(
    ("run", "edit", "field"), FORGERIES, ids=[f"{f[0]}-{f[1].__name__}" for f in FORGERIES]
)
def test_a_forged_receipt_is_invalid_and_compare_refuses_it(
    runs: dict[str, Path],
    copy_of: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    run: str,
    edit: Callable[[dict[str, Any]], None],
    field: str,
) -> None:
    forged = copy_of(run)
    before = receipt(forged)
    after = forge(forged, edit)
    assert after.to_json() != before
    assert fooled_without_rederivation(forged, monkeypatch)

    assert main(["verify", str(forged)]) == 1
    lines = capsys.readouterr().out.splitlines()
    said = [ln for ln in lines if ln.startswith(f"receipt.json: {field} is ")]
    assert said and "the rank records" in said[0], lines

    for base, head in ((runs[run], forged), (forged, runs[run])):
        assert main(["compare", str(base), str(head)]) == 2
        out, err = capsys.readouterr()
        assert "is not a valid bundle" in err and len(err.strip().splitlines()) == 1
        assert "no regression" not in out.lower()


def test_the_lazy_forgery_would_otherwise_read_as_no_regression(
    runs: dict[str, Path], copy_of: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forgery is worth refusing: with verify fooled, compare calls it an improvement."""
    from harness.qualify.compare import compare_bundles, load_bundle

    forged = copy_of("lazy")
    forge(forged, no_lazy_events)
    monkeypatch.setattr(verify, "rederive_problems", lambda *_: [])
    comparison = compare_bundles(load_bundle(runs["lazy"]), load_bundle(forged))
    assert comparison.exit_code == 0


def test_a_file_added_to_sha256sums_but_not_the_receipt_is_invalid(
    copy_of: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = copy_of("pass")
    (bundle / "records" / "rank-02.json").write_text('{"planted": true}\n')
    reseal(bundle)
    assert main(["verify", str(bundle)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "SHA256SUMS: lists records/rank-02.json, which receipt.json files does not name",
        "records/rank-02.json: not the file of a rank of this 2-rank run (its ranks' are "
        "rank-00.json to rank-01.json)",
    ]


def test_a_forged_summary_with_only_its_sums_line_rewritten_is_invalid(
    copy_of: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bundle = copy_of("lazy")
    summary = bundle / "summary.md"
    text = summary.read_text()
    assert text.startswith("# dcpqual: FAIL (not-qualified)\n")
    summary.write_text(text.replace("FAIL (not-qualified)", "PASS (source-qualified)", 1))
    sums = bundle / "SHA256SUMS"
    digest = hashlib.sha256(summary.read_bytes()).hexdigest()
    lines = [
        f"{digest}  summary.md" if line.endswith("  summary.md") else line
        for line in sums.read_text().splitlines()
    ]
    sums.write_text("\n".join(lines) + "\n")
    with monkeypatch.context() as patch:  # the hashes alone agree with the forgery
        patch.setattr(verify, "_check_summary", lambda *_: [])
        assert verify.verify_bundle(bundle).ok

    assert main(["verify", str(bundle)]) == 1
    [problem] = capsys.readouterr().out.splitlines()
    assert problem.startswith("summary.md: not what receipt.json renders: line 1 is ")
    assert "# dcpqual: FAIL (not-qualified)" in problem


def test_honest_bundles_verify_with_their_summaries(runs: dict[str, Path]) -> None:
    for bundle in runs.values():
        assert verify.verify_bundle(bundle).problems == ()


def test_a_narrowed_selection_is_a_limitation_of_the_run(runs: dict[str, Path]) -> None:
    deselected = receipt(runs["pass"])
    assert deselected["selection"]["deselected"] == 1
    [line] = [s for s in deselected["limitations"] if s.startswith("selection: ")]
    assert "1 collected tests deselected (-k, -m or --deselect)" in line
    assert "tests/rank_suites/rank_pass.py" in line  # not the suites/ folder either
    keyword = receipt(runs["lazy"])  # suites/capture/test_capture.py -k kimi
    [line] = [s for s in keyword["limitations"] if s.startswith("selection: ")]
    assert "collected tests deselected" in line and "test_capture.py" in line
