"""finalize_bundle on synthetic out folders: pass, fail, killed rank, timeout; overwrite refusal,
atomic writes, secret redaction."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
from _support.evidence_factory import (
    CAPTURE_TEST,
    COMBINE_TEST,
    DENIALS,
    GPU_DIGEST,
    NODES,
    capture,
    context,
    control,
    failed,
    failing_run,
    gpu_run,
    killed_run,
    passed,
    passing_run,
    timed_out_run,
    torchrun_logs,
    write_rank,
)

from harness.capture.events import LazyEvent
from harness.errors import UsageError
from harness.evidence.environment import REDACTED
from harness.evidence.files import parse_sums
from harness.evidence.junit import read_merged
from harness.evidence.verify import verify_bundle
from harness.evidence.writer import (
    default_out_dir,
    finalize_bundle,
    prepare_out_dir,
    release_out_dir,
)
from harness.schema.capture import DetectorStatus
from harness.schema.image import Image
from harness.schema.launch import Launch
from harness.schema.receipt import Receipt, RunExtra


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def keys(receipt: Receipt) -> set[str]:
    return {item.split(":", 1)[0] for item in receipt.limitations}


def test_passing_cpu_run_is_source_qualified_and_names_what_did_not_run(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    receipt = finalize_bundle(out, passing_run(out))

    assert (receipt.verdict, receipt.status, receipt.root_cause) == (
        "pass",
        "source-qualified",
        None,
    )
    assert receipt.failures == []
    assert receipt.geometry.world_size == 4 and receipt.geometry.backend == "gloo"
    assert {"gpu-capture", "nccl", "b12x-transport", "image", "multi-node"} <= keys(receipt)
    assert receipt.suites["capture"].passed == 2 and receipt.suites["capture"].rank_cases == 8
    assert receipt.suites["transport"].passed == 1
    assert receipt.capture.lazy_events == 0 and receipt.capture.paths == {"cpu-simulated": 4}
    assert receipt.capture.per_rank == {0: 0, 1: 0, 2: 0, 3: 0}
    assert (receipt.negative_control.expected, receipt.negative_control.detected) == (4, 4)
    assert receipt.negative_control.lazy_events == 4
    [row] = receipt.signatures  # the negative control's unwarmed signature stays out
    assert (row.model, row.total_heads, row.warmed, row.used_in_capture) == (
        "kimi-k3",
        16,
        True,
        True,
    )
    assert row.ranks == [0, 1, 2, 3] and row.consistent
    assert receipt.ranks.killed == [] and receipt.ranks.complete == 4
    assert receipt.sources["dcpqual"].commit is not None
    assert verify_bundle(out).ok

    on_disk = json.loads((out / "receipt.json").read_text())
    assert on_disk["schema"] == "dcpqual-receipt/v1"
    assert Receipt.from_json(on_disk) == receipt
    for name in ("verdict", "status", "geometry", "environment", "image", "sources", "suites"):
        assert name in on_disk
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# dcpqual: PASS (source-qualified)")
    assert "| kimi-k3 | 16 | 576 | 512 | bf16 | 4 | yes | yes | 4 |" in summary
    assert "- nccl: NCCL did not run: the backend was gloo" in summary


def test_sha256sums_lists_every_other_file_sorted(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    finalize_bundle(out, passing_run(out))
    text = (out / "SHA256SUMS").read_text()
    parsed = parse_sums(text)
    assert parsed.problems == ()
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert sorted(parsed.entries) == [p for p in on_disk if p != "SHA256SUMS"]
    assert list(parsed.entries) == sorted(parsed.entries)
    assert "junit/merged.xml" in parsed.entries and "torchrun/run-1/attempt_0/3/stdout.log" in text


def test_failing_run_names_the_primary_failure_and_keeps_every_record(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    ctx = failing_run(out, bad_rank=2)
    before = snapshot(out)
    receipt = finalize_bundle(out, ctx)

    assert (receipt.verdict, receipt.status) == ("fail", "not-qualified")
    assert receipt.root_cause is not None
    assert (receipt.root_cause.rank, receipt.root_cause.test) == (2, COMBINE_TEST)
    assert "combine mismatch" in receipt.root_cause.message
    assert receipt.suites["transport"].failed == 1
    assert "torchrun exited with code 1" in receipt.failures
    after = snapshot(out)
    assert {k: after[k] for k in before} == before  # every input kept, byte for byte
    assert verify_bundle(out).ok


def test_a_passing_run_that_left_processes_behind_fails_naming_them(tmp_path: Path) -> None:
    """Processes the launcher had to end after torchrun exited did work no test checked."""
    out = tmp_path / "bundle"
    launch = Launch(exit_code=0, leftovers=[4242, 4343])
    receipt = finalize_bundle(
        out, dataclasses.replace(passing_run(out), extra=RunExtra(launch=launch))
    )

    assert sum(t.failed + t.errors for t in receipt.suites.values()) == 0
    assert (receipt.verdict, receipt.status) == ("fail", "not-qualified")
    [reason] = receipt.failures
    assert "pids 4242, 4343" in reason and "after torchrun exited" in reason
    assert receipt.root_cause is not None and receipt.root_cause.message == reason
    assert verify_bundle(out).problems == ()


def test_killed_rank_is_a_failed_attributed_record(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    receipt = finalize_bundle(out, killed_run(out, dead_rank=1))

    assert receipt.verdict == "fail"
    assert receipt.ranks.killed == [1] and receipt.ranks.missing_junit == [1]
    assert receipt.ranks.reported == 4 and receipt.ranks.complete == 3
    cause = receipt.root_cause
    assert cause is not None and cause.kind == "killed"
    assert (cause.rank, cause.test) == (1, CAPTURE_TEST)
    assert "SIGKILL" in cause.message  # torchrun's error file joins the rank's own story
    assert "error.json" not in cause.message  # the file is in the bundle, not in the line
    assert receipt.run.extra.launch is not None
    assert receipt.run.extra.launch.leftovers == [4242]
    assert receipt.suites["capture"].errors == 1
    synthesized = [c for c in read_merged(out / "junit/merged.xml") if c.source == "synthesized"]
    assert [(c.rank, c.name, c.outcome) for c in synthesized] == [
        (1, "test_no_lazy_work[kimi-k3]", "error")
    ]
    assert "ranks" in keys(receipt)
    assert verify_bundle(out).ok


def test_rank_without_any_record_is_the_earliest_cause(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    ctx = failing_run(out, bad_rank=2)
    (out / "records" / "rank-03.json").unlink()
    (out / "junit" / "rank-03.xml").unlink()
    receipt = finalize_bundle(out, ctx)

    cause = receipt.root_cause
    assert cause is not None
    assert (cause.rank, cause.test, cause.kind) == (3, None, "killed")
    assert "left no record" in cause.message
    # merged.xml keeps rank_03_started (as xdist does for a dead worker), but the runner's own
    # account of a rank is no test: the tallies hold no pseudo-suite for it
    assert "ranks" not in receipt.suites
    synthesized = [c for c in read_merged(out / "junit/merged.xml") if c.source == "synthesized"]
    assert [(c.rank, c.name) for c in synthesized] == [(3, "rank_03_started")]
    assert verify_bundle(out).ok


def test_unreadable_record_and_report_are_kept_and_reported(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    ctx = passing_run(out)
    (out / "records" / "rank-01.json").write_text('{"schema": "dcpqual-rank-rec')
    (out / "junit" / "rank-01.xml").write_text("<testsuites><testsuite")
    receipt = finalize_bundle(out, ctx)

    assert receipt.verdict == "fail" and receipt.ranks.killed == [1]
    assert receipt.root_cause is not None and "unreadable" in receipt.root_cause.message
    junit_note = next(item for item in receipt.limitations if item.startswith("junit: "))
    assert "junit/rank-01.xml is unreadable" in junit_note
    assert "records/rank-01.json is unreadable" in junit_note
    assert "records/rank-01.json" in parse_sums((out / "SHA256SUMS").read_text()).entries
    assert verify_bundle(out).ok


def test_timed_out_run_fails_with_the_hang_as_root_cause(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    receipt = finalize_bundle(out, timed_out_run(out))

    assert receipt.verdict == "fail" and receipt.run.timed_out
    assert receipt.failures[0] == "the run timed out and was killed"
    assert receipt.ranks.killed == [0, 1, 2, 3]
    cause = receipt.root_cause
    assert cause is not None and (cause.rank, cause.test) == (0, CAPTURE_TEST)
    assert "timeout" in cause.message
    assert "(stack dump: stacks/rank-00.txt)" in cause.message
    assert "stacks/rank-02.txt" in parse_sums((out / "SHA256SUMS").read_text()).entries
    assert verify_bundle(out).ok


def test_lazy_event_during_capture_fails_a_run_whose_tests_passed(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    event = LazyEvent("transport-registry", 3, "created transport 16 heads x 576 -> 512")
    for rank in range(4):
        events = [event] if rank == 3 else []
        write_rank(out, rank, 4, captures=[capture(rank, events=events), control(rank)])
    receipt = finalize_bundle(out, context(4))

    assert receipt.verdict == "fail"
    assert receipt.capture.lazy_events == 1
    assert receipt.capture.by_detector == {"transport-registry": 1}
    assert receipt.capture.per_rank[3] == 1
    cause = receipt.root_cause
    assert cause is not None and (cause.rank, cause.kind) == (3, "lazy-event")
    assert verify_bundle(out).ok


def test_inactive_detectors_and_warmup_phase_events_are_reported(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    statuses = (
        DetectorStatus("transport-registry", active=True),
        DetectorStatus("cuda-memory", active=False, reason="CUDA is not available"),
    )
    event = LazyEvent("dynamo", 0, "compiled step", phase="warmup")
    for rank in range(2):
        events = [event] if rank == 0 else []
        caps = [capture(rank, events=events, detectors=statuses), control(rank)]
        write_rank(out, rank, 2, captures=caps)
    receipt = finalize_bundle(out, context(2))

    assert receipt.capture.inactive_detectors == {"cuda-memory": "CUDA is not available"}
    expected = "detectors: these detectors did not watch every capture window: cuda-memory"
    assert f"{expected} (CUDA is not available)" in receipt.limitations
    assert receipt.capture.replays == 4
    assert [e.phase for e in receipt.capture.events] == ["warmup"]
    assert receipt.verdict == "fail"  # lazy work in warm-up iterations still counts
    assert verify_bundle(out).ok


def test_undetected_negative_control_fails(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    for rank in range(4):
        write_rank(out, rank, 4, captures=[capture(rank), control(rank, detected=rank != 0)])
    receipt = finalize_bundle(out, context(4))

    assert receipt.verdict == "fail"
    assert (receipt.negative_control.expected, receipt.negative_control.detected) == (4, 3)
    assert receipt.negative_control.missed == [f"rank 0: {NODES[3]}"]
    assert receipt.root_cause is not None and receipt.root_cause.kind == "negative-control"


def test_signature_unwarmed_on_one_rank_is_reported_unwarmed(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    for rank in range(4):
        write_rank(out, rank, 4, captures=[capture(rank, warmed=rank != 2), control(rank)])
    receipt = finalize_bundle(out, context(4))

    [row] = receipt.signatures
    assert (row.warmed, row.used_in_capture, row.consistent) == (False, True, False)
    assert receipt.verdict == "fail"
    cause = receipt.root_cause
    assert cause is not None and (cause.rank, cause.kind) == (2, "signature")


def test_collected_tests_that_never_ran_are_not_a_pass(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    for rank in range(2):
        write_rank(out, rank, 2, tests=[], captures=[])
    receipt = finalize_bundle(out, context(2))
    assert receipt.verdict == "fail" and "no test passed" in receipt.failures
    assert receipt.coverage is not None and receipt.coverage.without_outcome == 2 * len(NODES)
    cause = receipt.root_cause
    assert cause is not None and cause.kind == "no-outcome"
    assert (cause.rank, cause.test) == (0, NODES[0])


def test_a_run_that_selected_no_test_is_not_a_pass(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    for rank in range(2):
        write_rank(out, rank, 2, tests=[], captures=[], collected=())
    receipt = finalize_bundle(out, context(2))
    assert receipt.verdict == "fail"
    assert receipt.failures[0].startswith("no test was selected on any rank")
    assert receipt.root_cause is not None and receipt.root_cause.kind == "run"
    assert verify_bundle(out).ok


def test_gpu_run_of_a_locked_image_is_qualified(tmp_path: Path, monkeypatch) -> None:
    receipt = gpu_run(tmp_path / "bundle", monkeypatch)

    assert (receipt.verdict, receipt.status) == ("pass", "qualified")
    assert not {"gpu-capture", "nccl", "b12x-transport", "image"} & keys(receipt)
    assert receipt.image is not None and receipt.image.digest == GPU_DIGEST
    assert verify_bundle(tmp_path / "bundle").ok


def test_gpu_run_without_an_image_is_only_source_qualified(tmp_path: Path, monkeypatch) -> None:
    receipt = gpu_run(tmp_path / "bundle", monkeypatch, image=None)
    assert (receipt.verdict, receipt.status) == ("pass", "source-qualified")
    assert "image" in keys(receipt)


@pytest.mark.parametrize(("change", "key"), DENIALS)
def test_a_gpu_run_that_must_admit_a_denying_limitation_is_only_source_qualified(
    tmp_path: Path, monkeypatch, change: dict[str, object], key: str
) -> None:
    """A locked image, NCCL and CUDA graphs are not enough: a path that did not run, or code
    the receipt does not identify, keeps the run from `qualified` however it passed."""
    receipt = gpu_run(tmp_path / "bundle", monkeypatch, **change)  # type: ignore[arg-type]
    assert (receipt.verdict, receipt.status) == ("pass", "source-qualified")
    assert key in keys(receipt)
    assert verify_bundle(tmp_path / "bundle").ok


def test_image_without_digest_is_named_as_a_limitation(tmp_path: Path, monkeypatch) -> None:
    receipt = gpu_run(tmp_path / "bundle", monkeypatch, image={"reference": "dcpqual/gpu16:dev"})
    assert receipt.status == "source-qualified"
    assert any(
        item.startswith("image: image dcpqual/gpu16:dev cannot qualify: image digest is missing")
        for item in receipt.limitations
    )


SECRET = "hf_PlantedSecretValue0123456789abcdef"


def test_planted_secret_never_appears_in_any_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("VLLM_API_KEY", "vllm-key-" + SECRET[3:])
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    out = tmp_path / "bundle"
    out.mkdir()
    for rank in range(2):
        tests = [passed(n) for n in NODES]
        if rank == 1:  # a failure message that printed the environment
            tests[1] = failed(COMBINE_TEST, f"env: HF_TOKEN={SECRET} & <x>")
        write_rank(out, rank, 2, tests=tests)
    torchrun_logs(out, 2, text=f"export HF_TOKEN={SECRET}\n{json.dumps({'t': SECRET})}\n")
    ctx = context(2, command=("torchrun", f"--token={SECRET}"), exit_code=1)
    receipt = finalize_bundle(out, ctx)

    for path in out.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
            assert SECRET[3:].encode() not in path.read_bytes(), path
    env = receipt.environment.env
    assert env["VLLM_API_KEY"] == REDACTED and env["NCCL_DEBUG"] == "INFO"
    assert "HF_TOKEN" not in env and "VLLM_API_KEY" in receipt.environment.redacted
    assert "torchrun/run-1/attempt_0/0/stdout.log" in receipt.scrubbed_files
    assert "records/rank-01.json" in receipt.scrubbed_files
    assert "[REDACTED]" in receipt.root_cause.message  # type: ignore[union-attr]
    assert verify_bundle(out).ok


def test_finalize_refuses_an_existing_bundle_and_touches_nothing(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    ctx = passing_run(out)
    finalize_bundle(out, ctx)
    before = snapshot(out)
    with pytest.raises(UsageError, match="never overwritten"):
        finalize_bundle(out, ctx)
    (out / "receipt.json").unlink()  # SHA256SUMS alone also marks a bundle
    with pytest.raises(UsageError, match="SHA256SUMS already exists"):
        finalize_bundle(out, ctx)
    before.pop("receipt.json")
    assert snapshot(out) == before


def test_finalize_interrupted_leaves_no_partial_file_and_can_be_rerun(
    tmp_path: Path, monkeypatch
) -> None:
    out = tmp_path / "bundle"
    ctx = passing_run(out)
    real_replace = os.replace

    def refuse_receipt(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
        if Path(dst).name == "receipt.json":
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", refuse_receipt)
    with pytest.raises(OSError, match="disk full"):
        finalize_bundle(out, ctx)
    names = {p.name for p in out.rglob("*")}
    assert "receipt.json" not in names and "SHA256SUMS" not in names
    assert not [n for n in names if n.endswith(".tmp")]

    monkeypatch.setattr(os, "replace", real_replace)
    finalize_bundle(out, ctx)
    assert verify_bundle(out).ok


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"dcp": 3}, "dcp=3 does not divide tp=4"),
        ({"backend": "mpi"}, "backend"),
    ],
)
def test_finalize_refuses_a_context_it_cannot_describe(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    out = tmp_path / "bundle"
    passing_run(out)
    before = snapshot(out)
    with pytest.raises(UsageError, match=message):
        finalize_bundle(out, context(4, **changes))
    assert snapshot(out) == before


def test_an_image_identity_without_a_sha256_digest_is_refused_where_it_is_born() -> None:
    with pytest.raises(ValueError, match="digest"):
        Image(reference="x", digest="latest")


def test_finalize_refuses_links(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    ctx = passing_run(out)
    (out / "torchrun" / "elsewhere.log").symlink_to(tmp_path)
    with pytest.raises(UsageError, match="symlink"):
        finalize_bundle(out, ctx)


def test_prepare_out_dir_creates_a_new_folder(tmp_path: Path) -> None:
    made = prepare_out_dir(tmp_path / "evidence" / "run-1")
    assert made.is_dir() and made.is_absolute() and not any(made.iterdir())
    with pytest.raises(UsageError, match="being used by another run"):
        prepare_out_dir(made)  # claimed: no second run gets in meanwhile
    release_out_dir(made)
    assert prepare_out_dir(made) == made  # an empty folder is fine
    release_out_dir(made)


def test_prepare_out_dir_refuses_a_non_empty_folder_and_touches_nothing(tmp_path: Path) -> None:
    out = tmp_path / "old"
    passing_run(out, world=2)
    before = snapshot(out)
    with pytest.raises(UsageError, match="not empty"):
        prepare_out_dir(out)
    assert snapshot(out) == before
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="not a folder"):
        prepare_out_dir(tmp_path / "file")


def test_default_out_dir_is_dated_and_unique() -> None:
    first, second = default_out_dir(), default_out_dir()
    assert first.parent == Path("evidence")
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", first.name)
    assert first != second
    assert not first.exists()
