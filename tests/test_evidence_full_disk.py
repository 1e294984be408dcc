"""A full disk never leaves a secret in the evidence: the scrub that begins every ending falls
back from the atomic rewrite to rewriting the file in place, and removes a file it cannot
rewrite at all; the receipt names both, a removed file fails the run, and where the bundle
cannot be written the launcher's last line says what was removed.

The disk is filled by `_support.full_disk` (ENOSPC or EDQUOT at the write calls).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import passing_run
from _support.forge import reseal
from _support.full_disk import fill_disk, full_disk

from harness.core.secrets import SCRUBBED, Scrubber
from harness.evidence import rules, writer
from harness.evidence.redact import ScrubFailed, scrub_folder
from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle
from harness.launch import launcher
from harness.launch.plan import RunOptions
from harness.launch.progress import PlainProgress
from harness.schema.launch import Launch
from harness.schema.receipt import Scrub

LONG = "hf_FullDiskSecret0123456789abcdef"  # longer than SCRUBBED: the scrubbed file shrinks
SHORT = "pw4short"  # shorter than SCRUBBED: the scrubbed file would grow


def leaks(root: Path, secret: str) -> list[str]:
    """Files under `root` whose name or bytes hold `secret`."""
    return [
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if secret in p.name or (p.is_file() and secret.encode() in p.read_bytes())
    ]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
@pytest.mark.parametrize("secret", [LONG, SHORT])
def test_on_a_full_disk_a_file_holding_a_secret_is_scrubbed_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, secret: str, code: int
) -> None:
    log = tmp_path / "torchrun" / "stdout.log"
    log.parent.mkdir()
    log.write_text(f"token {secret}\nmore {secret!r}\n")
    record = tmp_path / "records" / "rank-00.json"
    record.parent.mkdir()
    record.write_text(json.dumps({"message": f"refused {secret}", "n": 1}))
    inode = log.stat().st_ino
    fill_disk(monkeypatch, code)

    report = scrub_folder(tmp_path, Scrubber.of([secret]))

    assert leaks(tmp_path, secret) == []
    assert report.in_place == ("records/rank-00.json", "torchrun/stdout.log")
    assert report.changed == report.in_place and report.removed == ()
    assert log.stat().st_ino == inode  # the same file, rewritten where it is
    assert sorted(p.name for p in log.parent.iterdir()) == ["stdout.log"]  # no temp left
    if len(secret) >= len(SCRUBBED):
        assert log.read_text() == f"token {SCRUBBED}\nmore '{SCRUBBED}'\n"
        assert json.loads(record.read_text())["message"] == f"refused {SCRUBBED}"
    else:  # what would grow the file is masked to the secret's length instead
        assert SCRUBBED not in log.read_text() and "*" * len(secret) in log.read_text()


def test_on_a_full_disk_a_credential_known_by_its_shape_is_masked_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No variable holds these values; the text says they are credentials. Each is shorter
    than SCRUBBED, so it is masked to its own length."""
    log = tmp_path / "stdout.log"
    log.write_text("DB_PASSWORD=pw4 via https://oauth2:t0k@github.com/o/r\n")
    fill_disk(monkeypatch, errno.ENOSPC)

    report = scrub_folder(tmp_path, Scrubber.of([]))

    assert report.in_place == ("stdout.log",) and report.removed == ()
    assert log.read_text() == "DB_PASSWORD=*** via https://oauth2:***@github.com/o/r\n"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB tmpfs, where one can be mounted (root on Linux); skipped elsewhere."""
    where = tmp_path / "disk"
    where.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)]
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux")
    if subprocess.run(mount, capture_output=True, check=False).returncode != 0:
        pytest.skip("no tmpfs can be mounted here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def fill(disk: Path) -> None:
    with (disk / "filler").open("wb", buffering=0) as filler, contextlib.suppress(OSError):
        while True:
            filler.write(b"\0" * 512)


@pytest.mark.parametrize("secret", [LONG, SHORT])
def test_on_a_really_full_disk_no_secret_is_left(small_disk: Path, secret: str) -> None:
    out = small_disk / "out"
    (out / "torchrun").mkdir(parents=True)
    (out / "torchrun" / "stdout.log").write_text(f"HF_TOKEN={secret}\n" * 200)
    (out / "records").mkdir()
    (out / "records" / "rank-00.json").write_text(json.dumps({"m": f"x {secret}", "n": 1}))
    fill(small_disk)
    with pytest.raises(OSError, match="No space left"):
        (small_disk / "one-more").write_bytes(b"x" * 4096)

    report = scrub_folder(out, Scrubber.of([secret]))

    assert leaks(out, secret) == []
    assert report.in_place == ("records/rank-00.json", "torchrun/stdout.log")


def test_where_even_an_overwrite_fails_the_file_is_removed_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "agent.log").write_text(f"HF_TOKEN={LONG}\n")
    (tmp_path / "logs" / "plain.log").write_text("nothing secret\n")
    fill_disk(monkeypatch, overwrite_fails=True)

    report = scrub_folder(tmp_path, Scrubber.of([LONG]))

    assert leaks(tmp_path, LONG) == []
    assert report.removed == ("logs/agent.log",)
    assert report.changed == () and report.in_place == ()
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["plain.log"]


def test_a_file_that_cannot_be_read_is_removed_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "unreadable.log").write_text(f"HF_TOKEN={LONG}\n")
    real = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path.name == "unreadable.log":
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    report = scrub_folder(tmp_path, Scrubber.of([LONG]))
    assert report.removed == ("unreadable.log",)
    assert list(tmp_path.iterdir()) == []


def test_a_name_that_cannot_be_renamed_is_removed_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / f"notes-{LONG}").mkdir()
    (tmp_path / f"notes-{LONG}" / "a.txt").write_text("a\n")
    (tmp_path / f"{LONG}.txt").write_text("b\n")

    def rename(self: Path, target: Path) -> Path:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "rename", rename)
    report = scrub_folder(tmp_path, Scrubber.of([LONG]))
    assert leaks(tmp_path, LONG) == [] and list(tmp_path.iterdir()) == []
    assert report.removed == (f"{SCRUBBED}.txt", f"notes-{SCRUBBED}/a.txt")
    assert report.renamed == ()


def test_a_file_that_can_be_neither_scrubbed_nor_removed_stops_the_scrub_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "stuck.log").write_text(f"HF_TOKEN={LONG}\n")
    (tmp_path / "later.log").write_text(f"HF_TOKEN={LONG}\n")
    fill_disk(monkeypatch, overwrite_fails=True)
    real = Path.unlink

    def unlink(path: Path, missing_ok: bool = False) -> None:
        if path.name == "stuck.log":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        real(path, missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(ScrubFailed, match=r"^stuck\.log still holds a secret") as failed:
        scrub_folder(tmp_path, Scrubber.of([LONG]))
    assert failed.value.left == ("stuck.log",)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stuck.log"]  # the rest went on


def test_a_folder_still_holding_a_secret_gets_no_bundle_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def stuck(path: Path) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(Path, "unlink", stuck)
    code, out, _ = run_on(tmp_path, monkeypatch, overwrite_fails=True, for_scrub_only=False)

    assert code == 1
    assert not (out / "receipt.json").exists() and not (out / "SHA256SUMS").exists()
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        f"dcpqual run: error: no bundle written in {out}: {LOG} still holds a secret (could "
        "be neither scrubbed nor removed); remove them before sharing this folder"
    )


def test_a_removed_file_fails_the_run_by_name_and_verify_holds_the_writer_to_it(
    tmp_path: Path,
) -> None:
    out = tmp_path / "bundle"
    ctx = passing_run(out)
    removed = Scrub(in_place=["records/rank-00.json"], removed=["logs/agent.log"])
    receipt = finalize_bundle(
        out, replace(ctx, extra=ctx.extra.model_copy(update={"scrub": removed}))
    )
    assert receipt.verdict == "fail"
    assert receipt.failures == [
        "1 file that could not be scrubbed of secrets was removed from the evidence: logs/agent.log"
    ]
    assert verify_bundle(out).ok

    data = json.loads((out / "receipt.json").read_text())  # a pass despite the removed file
    data.update(verdict="pass", failures=[], root_cause=None)
    (out / "receipt.json").write_text(json.dumps(data))
    reseal(out)
    assert any("verdict is pass but its facts say fail" in p for p in verify_bundle(out).problems)


def test_what_the_writers_own_scrub_removes_is_named_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer scrubs the folder again before it reads it (for callers without the
    launcher); what that scrub had to remove reaches the receipt and fails the run as well."""
    monkeypatch.setenv("HF_TOKEN", LONG)
    out = tmp_path / "bundle"
    ctx = passing_run(out)
    (out / "notes.txt").write_text(f"HF_TOKEN={LONG}\n")
    scrub = writer.scrub_folder

    def on_a_full_disk(root: Path, scrubber: Scrubber) -> Any:
        with full_disk(overwrite_fails=True):
            return scrub(root, scrubber)

    monkeypatch.setattr(writer, "scrub_folder", on_a_full_disk)
    receipt = finalize_bundle(out, ctx)
    assert receipt.run.extra.scrub is not None and receipt.run.extra.scrub.removed == ["notes.txt"]
    assert receipt.failures == [rules.unscrubbable_reason(["notes.txt"])]
    assert leaks(out, LONG) == [] and verify_bundle(out).ok


def fake_launch(plan, *, tick=None, tick_s=0.5, console=None, reader=None, hold=None) -> Launch:
    """torchrun ran; a rank left the secret in its log."""
    log = plan.out_dir / LOG
    log.parent.mkdir(parents=True)
    log.write_text(f"HF_TOKEN={LONG}\n")
    return Launch(exit_code=0, started_at="s", finished_at="f", elapsed_s=0.2)


LOG = "torchrun/node-00/run/attempt_0/0/stdout.log"


def run_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, overwrite_fails: bool, for_scrub_only: bool
) -> tuple[int, Path, str]:
    """A fake launch and the real evidence writer; the disk fills as the ending begins (and has
    room again once the launcher's scrub is done, `for_scrub_only`)."""
    monkeypatch.setenv("HF_TOKEN", LONG)
    monkeypatch.setattr(launcher, "launch", fake_launch)
    real = launcher.Evidence.load()
    out = tmp_path / "out"

    def scrub_on_a_full_disk(path: Path) -> Any:
        if for_scrub_only:
            with full_disk(overwrite_fails=overwrite_fails):
                return real.scrub_out_dir(path)
        fill_disk(monkeypatch, overwrite_fails=overwrite_fails)
        return real.scrub_out_dir(path)

    evidence = replace(real, scrub_out_dir=scrub_on_a_full_disk)
    stream = io.StringIO()
    options = RunOptions(nproc_per_node=1, tp=1, out_dir=out)
    code = launcher.run(options, evidence=evidence, stream=stream, progress=PlainProgress(stream))
    return code, out, stream.getvalue()


@pytest.mark.parametrize("overwrite_fails", [False, True])
def test_when_the_bundle_cannot_be_written_the_last_line_tells_the_truth(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    overwrite_fails: bool,
) -> None:
    code, out, _ = run_on(
        tmp_path, monkeypatch, overwrite_fails=overwrite_fails, for_scrub_only=False
    )

    assert code == 1
    assert leaks(out, LONG) == []
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if "could not finish" in ln]
    assert "No space left on device; written: none" in line
    if overwrite_fails:
        assert line.endswith(
            "(the rank files are scrubbed and kept, except 1 removed because it could not be "
            f"scrubbed: {LOG})"
        )
        assert not (out / LOG).exists()
    else:
        assert line.endswith("(the rank files are scrubbed and kept)")
        assert (out / LOG).read_text() == f"HF_TOKEN={SCRUBBED}\n"


@pytest.mark.parametrize("overwrite_fails", [False, True])
def test_the_receipt_names_what_a_full_disk_made_the_scrub_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overwrite_fails: bool
) -> None:
    code, out, _ = run_on(
        tmp_path, monkeypatch, overwrite_fails=overwrite_fails, for_scrub_only=True
    )

    assert code == 1  # no rank left a record: the fake launch ran none
    assert leaks(out, LONG) == []
    receipt = json.loads((out / "receipt.json").read_text())
    scrub = receipt["run"]["extra"]["scrub"]
    if overwrite_fails:
        assert (scrub["in_place"], scrub["removed"]) == ([], [LOG])
        assert rules.unscrubbable_reason([LOG]) in receipt["failures"]
        assert LOG not in receipt["files"]
    else:
        assert (scrub["in_place"], scrub["removed"]) == ([LOG], [])
        assert LOG in receipt["scrubbed_files"] and LOG in receipt["files"]
    assert verify_bundle(out).ok


def test_on_a_full_disk_the_receipt_is_written_before_the_optional_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The small receipt says how the run ended; a merged JUnit report that no longer fits
    must not cost it. It witnesses the report by the bytes it was to hold, so verify names
    the report as missing, not the receipt as wrong."""
    from _support.evidence_factory import failing_run

    from harness.evidence import writer
    from harness.evidence.verify import verify_bundle

    out = tmp_path / "bundle"
    ctx = failing_run(out, world=2, bad_rank=1)
    real_write = writer.atomic_write_bytes

    def full_disk(path: Path, data: bytes, **kw: object) -> None:
        if path.name == "merged.xml":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_write(path, data, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "atomic_write_bytes", full_disk)
    with pytest.raises(OSError, match="No space left"):
        writer.finalize_bundle(out, ctx)
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["verdict"] == "fail" and "junit/merged.xml" in receipt["files"]
    assert not (out / "junit" / "merged.xml").exists()
    problems = verify_bundle(out).problems
    assert any("junit/merged.xml" in p for p in problems), problems
