"""Every capture window lists the detectors that watched it; a detector missing from a window's
list did not watch that window. The capture code gives every window the same detector set, so
a detector the run's records list anywhere (a window, a negative control) is expected in every
window, and one absent from some windows is named in `capture.inactive_detectors` with the
`detectors` limitation, which keeps a GPU run from `qualified`. A forger who trims a detector
from a window's list, or the list itself, and keeps the receipt that says every window was
watched, is caught.

Bundles written before windows listed their detectors list none anywhere: they still verify
(`legacy`, which rewrites a new bundle as that writer wrote it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import WATCHED, gpu_run, watched_but
from _support.forge import edit_records, forge

from harness.evidence.collect import unwatched
from harness.evidence.verify import verify_bundle
from harness.schema.capture import IMPORT_BLIND, CaptureRecord, DetectorStatus
from harness.schema.receipt import Receipt

TRITON = "triton-jit"
DETECTORS_LINE = "detectors: these detectors did not watch every capture window: "


def _qualified(out: Path, monkeypatch: pytest.MonkeyPatch) -> Receipt:
    written = gpu_run(out, monkeypatch, detectors=WATCHED, control_detectors=WATCHED)
    assert written.status == "qualified", written.limitations
    return written


def test_a_run_whose_every_window_lists_every_detector_is_qualified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = _qualified(tmp_path / "bundle", monkeypatch)
    assert written.capture.inactive_detectors == {}
    result = verify_bundle(tmp_path / "bundle")
    assert result.ok, result.problems


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"window_detectors": {3: watched_but(TRITON)}}, {TRITON: "absent from 1 of 4 windows"}),
        ({"detectors": watched_but(TRITON)}, {TRITON: "absent from 4 of 4 windows"}),
        (
            {"window_detectors": {1: (), 2: ()}},
            {s.name: "absent from 2 of 4 windows" for s in WATCHED},
        ),
    ],
    ids=["one-window", "every-window-but-not-the-controls", "empty-lists"],
)
def test_a_detector_missing_from_a_windows_list_did_not_watch_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    changes: dict[str, Any],
    named: dict[str, str],
) -> None:
    out = tmp_path / "bundle"
    written = gpu_run(
        out, monkeypatch, **{"detectors": WATCHED, "control_detectors": WATCHED, **changes}
    )
    assert written.capture.inactive_detectors == named
    (line,) = [x for x in written.limitations if x.startswith("detectors: ")]
    assert line.startswith(DETECTORS_LINE) and f"{TRITON} ({named[TRITON]})" in line, line
    assert written.status == "source-qualified"
    result = verify_bundle(out)
    assert result.ok, result.problems


def _trim(name: str, ranks: tuple[int, ...]) -> Any:
    """A record edit: the real capture windows of `ranks` no longer list detector `name`."""

    def change(record: dict[str, Any]) -> None:
        if record["rank"] not in ranks:
            return
        for window in record["captures"]:
            if not window["negative_control"]:
                window["detectors"] = [d for d in window["detectors"] if d["name"] != name]

    return change


def _unlist(windows_only: bool) -> Any:
    """A record edit: windows (and, unless `windows_only`, controls) list no detectors."""

    def change(record: dict[str, Any]) -> None:
        for window in record["captures"]:
            if not (windows_only and window["negative_control"]):
                window["detectors"] = []

    return change


@pytest.mark.parametrize(
    "change, named",
    [
        (_trim(TRITON, (3,)), TRITON),
        (_trim(TRITON, (0, 1, 2, 3)), TRITON),
        (_unlist(windows_only=True), "b12x-kernel-resolution"),
    ],
    ids=["one-window", "every-window", "lists-of-windows"],
)
def test_records_trimmed_under_a_qualified_receipt_do_not_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Any, named: str
) -> None:
    """The red team's forgery: the records say a window was watched by fewer detectors, the
    receipt (hashes resealed) still says every window was watched and `qualified`."""
    out = tmp_path / "bundle"
    _qualified(out, monkeypatch)
    edit_records(out, change)
    problems = " ".join(verify_bundle(out).problems)
    said = f"capture.inactive_detectors.{named} is absent but the rank records"
    assert said in problems and "windows'" in problems, problems


def _hide(data: dict[str, Any]) -> None:
    data["capture"]["inactive_detectors"] = {}
    _drop_limitation(data)


def _drop_limitation(data: dict[str, Any]) -> None:
    data["limitations"] = [x for x in data["limitations"] if not x.startswith("detectors: ")]


@pytest.mark.parametrize(
    "edit, named",
    [
        (_drop_limitation, "limitations do not name 'detectors'"),
        (_hide, "is absent but the rank records and JUnit reports say 'absent from 1 of 4"),
    ],
    ids=["limitation", "limitation-and-detector"],
)
def test_a_receipt_that_drops_the_detectors_limitation_does_not_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Any, named: str
) -> None:
    out = tmp_path / "bundle"
    gpu_run(
        out,
        monkeypatch,
        detectors=WATCHED,
        control_detectors=WATCHED,
        window_detectors={3: watched_but(TRITON)},
    )
    forge(out, edit)
    problems = " ".join(verify_bundle(out).problems)
    assert named in problems, problems


# -- bundles written before windows listed their detectors ------------------------------------


def legacy(bundle: Path) -> None:
    """`bundle` as the writer before detector lists wrote it: no capture record lists any
    detector, and the receipt says what such records give (no inactive detector)."""
    edit_records(bundle, _unlist(windows_only=False))

    forge(bundle, _hide)


def test_a_legacy_bundle_verifies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "bundle"
    gpu_run(out, monkeypatch, detectors=WATCHED, control_detectors=WATCHED)
    legacy(out)
    result = verify_bundle(out)
    assert result.ok, result.problems
    receipt = Receipt.model_validate_json((out / "receipt.json").read_text())
    assert receipt.capture.inactive_detectors == {} and receipt.status == "qualified"


def test_a_legacy_bundle_with_one_listed_window_is_held_to_its_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One record that lists detectors makes the run a new one: the other windows, listing
    none, were watched by none of them."""
    out = tmp_path / "bundle"
    written = gpu_run(out, monkeypatch, window_detectors={0: WATCHED})
    assert written.capture.inactive_detectors == {
        s.name: "absent from 3 of 4 windows" for s in WATCHED
    }
    assert written.status == "source-qualified"
    assert verify_bundle(out).ok


# -- what a window's list can say --------------------------------------------------------------


def _window(*statuses: DetectorStatus, control: bool = False) -> CaptureRecord:
    return CaptureRecord(
        test="t",
        model="m",
        rank=0,
        path="cuda-graph",
        warm_impl="w",
        detectors=statuses,
        negative_control=control,
    )


def test_a_blind_spot_counts_where_listed_and_is_not_expected_elsewhere() -> None:
    """A blind spot is a running detector's own admission, listed only where it applies (a
    forked rank's window): a window without it (a cold rank's) was watched in full."""
    blind = DetectorStatus(IMPORT_BLIND, active=False, reason="imported by the preload")
    forked, cold = _window(*WATCHED, blind), _window(*WATCHED)
    assert unwatched([forked, cold], [forked, cold]) == {IMPORT_BLIND: "imported by the preload"}
    control = _window(*WATCHED, blind, control=True)
    assert unwatched([cold], [cold, control]) == {}


def test_an_inactive_status_keeps_its_reason_where_other_windows_lack_it() -> None:
    gone = DetectorStatus("cuda-memory", active=False, reason="no CUDA")
    here, trimmed = _window(gone), _window()
    assert unwatched([here, trimmed], [here, trimmed]) == {"cuda-memory": "no CUDA"}
