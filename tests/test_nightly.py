"""`dcpqual nightly`: the pipeline with fake steps that write real bundles, and the real steps
failing closed on this machine."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from _support.evidence_factory import failing_run, passing_run

from harness.cli import main
from harness.errors import UsageError
from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle
from harness.qualify.nightly import bundles_in, default_steps, run_nightly, write_report

STEPS = (("image",), ("gpu16",))
Writer = Callable[[Path], None]


def good(out: Path) -> None:
    finalize_bundle(out, passing_run(out, world=2))


def bad(out: Path) -> None:
    finalize_bundle(out, failing_run(out, world=2, bad_rank=1))


def fake_steps(
    archive: Path, name: str, write: Writer | None, codes: dict[str, int] | None = None
) -> tuple[Callable[[Sequence[str]], int], list[str]]:
    """A runner for STEPS: gpu16 writes `write`'s bundle as `name` into the archive."""
    ran: list[str] = []
    codes = codes or {}

    def run(argv: Sequence[str]) -> int:
        ran.append(argv[0])
        if argv[0] == "gpu16" and write is not None:
            write(archive / name)
        return codes.get(argv[0], 0)

    return run, ran


def quiet(_: str) -> None:
    pass


def test_the_archive_must_exist(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        run_nightly(tmp_path / "missing", STEPS, run=lambda argv: 0, emit=quiet)


def test_a_step_that_cannot_run_stops_the_night_with_its_code(tmp_path: Path) -> None:
    run, ran = fake_steps(tmp_path, "unused", None, codes={"image": 2})
    result = run_nightly(tmp_path, STEPS, run=run, emit=quiet)
    assert ran == ["image"]
    assert result.bundle is None and result.exit_code == 2
    assert result.problems == (f"no new bundle in {tmp_path} (step 1 exited 2)",)


def test_steps_that_succeed_without_a_bundle_fail_closed(tmp_path: Path) -> None:
    run, _ = fake_steps(tmp_path, "unused", None)
    assert run_nightly(tmp_path, STEPS, run=run, emit=quiet).exit_code == 2


def test_first_night_passes_with_nothing_to_compare(tmp_path: Path) -> None:
    run, ran = fake_steps(tmp_path, "20261129T020000Z-gpu16-abc", good)
    result = run_nightly(tmp_path, STEPS, run=run, emit=quiet)
    assert ran == ["image", "gpu16"]
    assert result.bundle == tmp_path / "20261129T020000Z-gpu16-abc"
    assert (result.previous, result.comparison, result.verdict) == (None, None, "pass")
    assert result.exit_code == 0, result.problems


def test_a_regressing_night_is_compared_with_the_newest_valid_bundle(tmp_path: Path) -> None:
    good(tmp_path / "20261127T020000Z-gpu16-abc")
    good(tmp_path / "20261128T020000Z-gpu16-abc")
    broken = tmp_path / "20261128T120000Z-gpu16-abc"
    good(broken)
    (broken / "summary.md").write_text("edited\n")
    (tmp_path / "notes").mkdir()  # not a bundle name: ignored
    run, _ = fake_steps(tmp_path, "20261129T020000Z-gpu16-abc", bad, codes={"gpu16": 1})
    result = run_nightly(tmp_path, STEPS, run=run, emit=quiet)
    assert result.previous == tmp_path / "20261128T020000Z-gpu16-abc"
    assert len(result.skipped_previous) == 1 and broken.name in result.skipped_previous[0]
    assert result.comparison is not None and result.comparison.regressed
    assert result.exit_code == 1
    assert result.problems[:2] == ("step 2 exited 1", "verdict fail")
    assert "regression against 20261128T020000Z-gpu16-abc: verdict pass -> fail" in result.problems


def test_an_invalid_new_bundle_fails(tmp_path: Path) -> None:
    def tampered(out: Path) -> None:
        good(out)
        (out / "receipt.json").write_text("{}")

    run, _ = fake_steps(tmp_path, "20261129T020000Z-gpu16-abc", tampered)
    result = run_nightly(tmp_path, STEPS, run=run, emit=quiet)
    assert result.exit_code == 1 and "is not a valid bundle" in result.problems[0]


def test_the_report_holds_the_comparison_and_a_verifiable_copy(tmp_path: Path) -> None:
    archive, report = tmp_path / "archive", tmp_path / "report"
    archive.mkdir()
    good(archive / "20261128T020000Z-gpu16-abc")
    run, _ = fake_steps(archive, "20261129T020000Z-gpu16-abc", good)
    result = run_nightly(archive, STEPS, run=run, emit=quiet)
    write_report(result, report)
    summary = json.loads((report / "nightly.json").read_text())
    assert summary["exit_code"] == 0 and summary["bundle"].endswith("20261129T020000Z-gpu16-abc")
    assert (report / "compare.md").read_text().startswith("### dcpqual compare: no regression")
    assert json.loads((report / "compare.json").read_text())["regressed"] is False
    assert verify_bundle(report / "20261129T020000Z-gpu16-abc").ok
    assert [p.name for p in bundles_in(archive)] == [
        "20261128T020000Z-gpu16-abc",
        "20261129T020000Z-gpu16-abc",
    ]


def test_default_steps_build_the_image_then_run_gpu16_into_the_archive(tmp_path: Path) -> None:
    image, gpu16 = default_steps(tmp_path)
    assert image == (sys.executable, "-m", "harness", "image", "build")
    assert gpu16 == (sys.executable, "-m", "harness", "gpu16", "--evidence-root", str(tmp_path))
    (host,) = default_steps(tmp_path, no_image=True)
    assert host[3:5] == ("gpu16", "--no-image") and host[-1] == str(tmp_path)


@pytest.mark.slow
def test_nightly_fails_closed_on_this_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No pinned lock, engine or GPUs here: the first real step refuses, nothing is archived."""
    archive, report = tmp_path / "archive", tmp_path / "report"
    archive.mkdir()
    code = main(["nightly", "--archive", str(archive), "--report", str(report)])
    assert code == 2
    assert list(archive.iterdir()) == []
    assert json.loads((report / "nightly.json").read_text())["bundle"] is None
    assert "FAILED (exit 2)" in capsys.readouterr().out
