"""What a run left in its out folder that is not evidence: set aside (whatever the run wrote at
or under `strays/` included), always leaving a bundle that can be written, and held by
`dcpqual verify` to the `strays/` folder the bundle really holds."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import passing_run
from _support.forge import forge
from _support.locked import hold_to_modes, lock, refuse_chmod

from harness.evidence.strays import set_aside
from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle
from harness.schema.receipt import Receipt, Stray

FORGED = json.dumps({"schema": "dcpqual-receipt/v1", "verdict": "pass"})


def bundle_left_with(out: Path, leave: Callable[[Path], None]) -> tuple[Receipt, list[Stray]]:
    """A passing 2-rank run whose tests also `leave` things in the out folder, ended as the
    launcher ends it: strays set aside, then the bundle written."""
    ctx = passing_run(out, world=2)
    leave(out)
    strays = set_aside(out)
    receipt = finalize_bundle(
        out, replace(ctx, extra=ctx.extra.model_copy(update={"strays": strays}))
    )
    return receipt, strays


def actions(strays: list[Stray]) -> dict[str, str]:
    return {s.path: s.action for s in strays}


def assert_failed_for_strays(out: Path, receipt: Receipt) -> None:
    assert receipt.verdict == "fail"
    assert any("not evidence" in f for f in receipt.failures), receipt.failures
    assert verify_bundle(out).problems == ()


def test_bundle_named_files_are_moved_under_strays_and_the_run_fails(tmp_path: Path) -> None:
    out = tmp_path / "bundle"

    def leave(out: Path) -> None:
        (out / "receipt.json").write_text(FORGED)
        (out / "junit" / "merged.xml").write_text("<testsuites/>")

    receipt, strays = bundle_left_with(out, leave)
    assert actions(strays) == {
        "junit/merged.xml": "moved to strays/junit/merged.xml",
        "receipt.json": "moved to strays/receipt.json",
    }
    assert (out / "strays" / "receipt.json").read_text() == FORGED
    assert_failed_for_strays(out, receipt)


def test_files_a_test_wrote_under_strays_are_strays_themselves(tmp_path: Path) -> None:
    """Else they would sit in `strays/` unnamed, looking set aside, in a run that passes."""
    out = tmp_path / "bundle"

    def leave(out: Path) -> None:
        (out / "strays" / "deep").mkdir(parents=True)
        (out / "strays" / "receipt.json").write_text(FORGED)
        (out / "strays" / "deep" / "notes.txt").write_text("mine")
        (out / "receipt.json").write_text(FORGED)

    receipt, strays = bundle_left_with(out, leave)
    assert actions(strays) == {
        "receipt.json": "moved to strays/receipt.json",
        "strays/deep/notes.txt": "moved to strays/strays/deep/notes.txt",
        "strays/receipt.json": "moved to strays/strays/receipt.json",
    }
    assert (out / "strays" / "strays" / "deep" / "notes.txt").read_text() == "mine"
    assert_failed_for_strays(out, receipt)


def test_a_file_named_strays_is_set_aside_and_the_bundle_is_still_written(tmp_path: Path) -> None:
    out = tmp_path / "bundle"

    def leave(out: Path) -> None:
        (out / "strays").write_text("not a folder")
        (out / "summary.md").write_text("# all passed")

    receipt, strays = bundle_left_with(out, leave)
    assert actions(strays) == {
        "strays": "moved to strays/strays",
        "summary.md": "moved to strays/summary.md",
    }
    assert (out / "strays" / "strays").read_text() == "not a folder"
    assert_failed_for_strays(out, receipt)


def test_a_link_named_strays_takes_nothing_out_of_the_bundle(tmp_path: Path) -> None:
    """Set-aside files go into the bundle's own `strays/`, never through a link the run made."""
    out, elsewhere = tmp_path / "bundle", tmp_path / "elsewhere"
    elsewhere.mkdir()

    def leave(out: Path) -> None:
        (out / "strays").symlink_to(elsewhere, target_is_directory=True)
        (out / "receipt.json").write_text(FORGED)

    receipt, strays = bundle_left_with(out, leave)
    assert list(elsewhere.iterdir()) == []
    assert actions(strays) == {"receipt.json": "moved to strays/receipt.json", "strays": "removed"}
    assert (out / "strays" / "receipt.json").read_text() == FORGED
    assert_failed_for_strays(out, receipt)


@pytest.mark.parametrize("where", ["receipt.json", "junit/merged.xml", "SHA256SUMS", "launch.json"])
def test_a_folder_where_the_writer_writes_a_file_is_set_aside(tmp_path: Path, where: str) -> None:
    out = tmp_path / "bundle"

    def leave(out: Path) -> None:
        (out / where / "empty").mkdir(parents=True)
        (out / where / "inside.txt").write_text("x")

    receipt, strays = bundle_left_with(out, leave)
    assert actions(strays) == {
        where: "removed",
        f"{where}/inside.txt": f"moved to strays/{where}/inside.txt",
    }
    assert {s.kind for s in strays} == {"folder", "file"}
    assert (out / where).is_file()  # the writer's own
    assert_failed_for_strays(out, receipt)


def test_a_file_where_the_writer_needs_a_folder_is_set_aside(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    ctx = passing_run(out, world=2)
    for junit in (out / "junit").iterdir():  # a test that wrote `junit` before pytest did
        junit.unlink()
    (out / "junit").rmdir()
    (out / "junit").write_text("a file")
    strays = set_aside(out)
    assert actions(strays) == {"junit": "moved to strays/junit"}
    receipt = finalize_bundle(
        out, replace(ctx, extra=ctx.extra.model_copy(update={"strays": strays}))
    )
    assert receipt.verdict == "fail" and verify_bundle(out).problems == ()


def test_a_folder_the_run_locked_is_opened_and_its_files_are_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder its owner cannot list is given back to the owner (u+rwx): what it holds is
    hashed and listed like any file the run left, not skipped."""
    hold_to_modes(monkeypatch, tmp_path)
    out = tmp_path / "bundle"

    def leave(out: Path) -> None:
        (out / "notes" / "locked").mkdir(parents=True)
        (out / "notes" / "locked" / "a.txt").write_text("kept\n")
        lock(out / "notes" / "locked")

    receipt, strays = bundle_left_with(out, leave)
    assert strays == []
    assert "notes/locked/a.txt" in receipt.files
    assert verify_bundle(out).problems == ()


def test_a_locked_folder_that_cannot_be_opened_is_removed_as_a_stray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold_to_modes(monkeypatch, tmp_path)
    out = tmp_path / "bundle"

    def leave(out: Path) -> None:
        lock(out / "notes" / "locked")
        refuse_chmod(monkeypatch, out)

    receipt, strays = bundle_left_with(out, leave)
    assert strays == [Stray(path="notes/locked", kind="unreadable", action="removed")]
    assert not (out / "notes" / "locked").exists()
    assert_failed_for_strays(out, receipt)


# -- verify holds the receipt's strays to the bundle's strays/ ---------------------------------


@pytest.fixture
def with_strays(tmp_path: Path) -> Path:
    out = tmp_path / "bundle"

    def leave(out: Path) -> None:
        (out / "receipt.json").write_text(FORGED)
        (out / "a-link").symlink_to("/etc/hostname")

    bundle_left_with(out, leave)
    assert verify_bundle(out).problems == ()
    return out


def _drop_strays(data: dict[str, Any]) -> None:
    data["run"]["extra"]["strays"] = []


def test_a_receipt_emptied_of_its_strays_does_not_verify(with_strays: Path) -> None:
    """The careful forger: strays gone from the receipt, verdict recomputed to pass, summary and
    hashes regenerated; the set-aside file is still in the bundle."""
    forged = forge(with_strays, _drop_strays)
    assert forged.verdict == "pass"
    assert verify_bundle(with_strays).problems == (
        "strays/receipt.json: under strays/ but no stray in receipt.json was moved there",
    )


def test_a_stray_whose_set_aside_file_is_gone_does_not_verify(with_strays: Path) -> None:
    (with_strays / "strays" / "receipt.json").unlink()
    forge(with_strays, lambda d: d["files"].pop("strays/receipt.json"))
    assert verify_bundle(with_strays).problems == (
        "strays/receipt.json: missing (receipt.json run.extra.strays says receipt.json was "
        "moved there)",
    )


def test_a_file_added_under_strays_does_not_verify(with_strays: Path) -> None:
    added = with_strays / "strays" / "extra.txt"
    added.write_text("unnamed")

    def name_it(data: dict[str, Any]) -> None:
        from harness.evidence.files import sha256_file

        data["files"]["strays/extra.txt"] = sha256_file(added)

    forge(with_strays, name_it)
    assert verify_bundle(with_strays).problems == (
        "strays/extra.txt: under strays/ but no stray in receipt.json was moved there",
    )


@pytest.mark.parametrize("action", ["moved to records/rank-00.json", "kept"])
def test_a_stray_neither_removed_nor_moved_under_strays_does_not_verify(
    with_strays: Path, action: str
) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["run"]["extra"]["strays"].append({"path": "x", "kind": "file", "action": action})
        data["root_cause"] = None  # the forger's: the verdict's first reason, which names x

    forge(with_strays, edit)
    assert verify_bundle(with_strays).problems == (
        f"receipt.json: run.extra.strays: x was {action!r}, neither removed nor moved under "
        "strays/",
    )


@pytest.mark.parametrize("where", [b"", b"notes/"], ids=["top", "in-a-folder"])
def test_a_file_name_that_is_not_utf8_is_set_aside_and_the_bundle_is_written(
    tmp_path: Path, where: bytes
) -> None:
    """SHA256SUMS is UTF-8 text: a name no UTF-8 encoder takes would stop it, while the
    receipt, written first, says pass."""
    out = tmp_path / "bundle"

    def leave(out: Path) -> None:
        folder = os.fsencode(out) + b"/" + where
        os.makedirs(folder, exist_ok=True)
        with open(folder + b"latin1-\xe9t\xe9.log", "wb") as fh:
            fh.write(b"kept\n")

    receipt, strays = bundle_left_with(out, leave)
    [stray] = strays
    assert stray.action.startswith("moved to strays/") and "\\" not in stray.path
    moved = out / stray.action.removeprefix("moved to ")
    assert moved.read_bytes() == b"kept\n"
    assert (out / "SHA256SUMS").is_file()
    assert_failed_for_strays(out, receipt)
