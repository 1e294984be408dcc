"""The smoke's evidence bundle: verified by `dcpqual verify`, verdict agreeing with the smoke's
own, the same receipt schema as `dcpqual run`, and limitations that name what did not run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from _support.smoke import FAULTS, H200, passing_result

from harness.evidence.verify import verify_bundle
from harness.schema.receipt import Receipt
from harness.schema.smoke import CAPTURE_TEST, REQUIRED_CONTROLS, SmokeResult, control_test
from harness.smoke.bundle import PINNED_TORCH, write_smoke_bundle

REPO = Path(__file__).resolve().parent.parent


def bundle(tmp_path: Path, result: SmokeResult) -> tuple[Path, Receipt]:
    out = tmp_path / "bundle"
    out.mkdir()
    return out, write_smoke_bundle(out, result, command=["dcpqual", "gpu-smoke"])


def keys(receipt: Receipt) -> set[str]:
    return {line.split(": ", 1)[0] for line in receipt.limitations}


def test_a_passing_smoke_leaves_a_verified_passing_bundle(tmp_path: Path) -> None:
    out, receipt = bundle(tmp_path, passing_result())
    assert verify_bundle(out).problems == ()
    assert receipt.verdict == "pass"
    assert receipt.status == "source-qualified"  # never qualified: no image, world 1
    geometry = receipt.geometry
    assert (geometry.world_size, geometry.backend, geometry.tp, geometry.dcp) == (1, "nccl", 1, 1)
    assert receipt.suites["smoke"].passed == 1 + len(REQUIRED_CONTROLS)
    assert receipt.suites["smoke"].failed == 0
    assert receipt.capture.paths == {"cuda-graph": 1}
    assert receipt.capture.lazy_events == 0 and receipt.capture.replays == 2
    control = receipt.negative_control
    assert (control.expected, control.detected) == (4, 4)
    assert control.by_detector == dict.fromkeys(sorted(REQUIRED_CONTROLS), 1)
    assert [s.total_heads for s in receipt.signatures] == [96]
    assert receipt.signatures[0].warmed and receipt.signatures[0].used_in_capture
    for name in ("records/rank-00.json", "junit/rank-00.xml", "smoke/result.json"):
        assert (out / name).is_file()
    saved = json.loads((out / "smoke/result.json").read_text())
    assert SmokeResult.from_json(saved) == passing_result()


def test_limitations_name_world_1_b12x_sm_and_the_installed_torch(tmp_path: Path) -> None:
    _, receipt = bundle(tmp_path, passing_result())
    assert {"smoke", "world-1", "b12x-sm12x", "controls", "torch", "b12x-transport"} <= keys(
        receipt
    )
    assert {"gpu-capture", "nccl"}.isdisjoint(keys(receipt))  # those did run
    text = "\n".join(receipt.limitations)
    assert "world 1" in text and "sm_90" in text and "b12x is not installed" in text
    assert "torch 2.11.0+cu130" in text
    assert "96 heads x 576 -> 512 (bf16, dcp=16" in text  # the signature warmup found


def test_the_pinned_torch_is_no_limitation(tmp_path: Path) -> None:
    pinned = dataclasses.replace(
        passing_result(), machine=H200.model_copy(update={"torch": "2.13.0"})
    )
    _, receipt = bundle(tmp_path, pinned)
    assert "torch" not in keys(receipt)


def test_the_pin_the_smoke_compares_with_is_the_sessions() -> None:
    """pyproject allows a range of torch; the exact pin is the one the nox sessions install."""
    from _support.noxfile import load_noxfile

    assert f"torch=={PINNED_TORCH}" == load_noxfile().TORCH_PIN


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_faulty_smoke_leaves_a_verified_failing_bundle(tmp_path: Path, fault: str) -> None:
    apply, needle = FAULTS[fault]
    out, receipt = bundle(tmp_path, apply(passing_result()))
    assert verify_bundle(out).problems == ()
    assert receipt.verdict == "fail" and receipt.status == "not-qualified"
    assert receipt.root_cause is not None
    assert receipt.root_cause.test in (CAPTURE_TEST, *map(control_test, REQUIRED_CONTROLS))
    failed = [t for t in receipt_tests(out) if t["outcome"] == "failed"]
    assert any(needle in (t["message"] or "") for t in failed)


def receipt_tests(out: Path) -> list[dict]:
    return json.loads((out / "records/rank-00.json").read_text())["tests"]


def test_a_missed_control_is_counted_as_missed(tmp_path: Path) -> None:
    _, receipt = bundle(tmp_path, FAULTS["control-other-detector"][0](passing_result()))
    assert receipt.negative_control.detected == 3
    assert receipt.negative_control.missed == [f"rank 0: {control_test('transport-registry')}"]


def test_a_control_that_could_not_run_leaves_no_window(tmp_path: Path) -> None:
    _, receipt = bundle(tmp_path, FAULTS["control-not-run"][0](passing_result()))
    assert receipt.negative_control.expected == 3
    assert receipt.suites["smoke"].failed == 1
