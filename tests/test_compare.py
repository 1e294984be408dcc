"""`dcpqual compare`: synthetic receipts for the judgement, real bundles for the command."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import failing_run, passing_run

from harness.cli import main
from harness.core.signature import TransportSignature
from harness.errors import UsageError
from harness.evidence.writer import finalize_bundle
from harness.qualify.compare import compare_receipts, describe_signature, load_bundle
from harness.qualify.report import code, render_markdown, render_text
from harness.schema.receipt import Receipt

KIMI = TransportSignature(
    dtype="bf16", total_heads=96, query_head_dim=576, output_head_dim=512, dcp_world_size=2
)
KIMI_WORDS = KIMI.describe()


def signature_row(model: str, sig: TransportSignature, *, warmed: bool = True) -> dict[str, Any]:
    return {
        "model": model,
        "total_heads": sig.total_heads,
        "query_head_dim": sig.query_head_dim,
        "output_head_dim": sig.output_head_dim,
        "dtype": sig.dtype,
        "warmed": warmed,
        "used_in_capture": True,
        "dcp_world_size": sig.dcp_world_size,
        "max_tokens": sig.max_tokens,
        "device_type": sig.device_type,
    }


def receipt(**changes: Any) -> dict[str, Any]:
    """A schema-valid passing receipt of a 2-rank gloo run; `changes` replace top-level keys."""
    data: dict[str, Any] = {
        "schema": "dcpqual-receipt/v1",
        "verdict": "pass",
        "status": "source-qualified",
        "geometry": {
            "world_size": 2,
            "nnodes": 1,
            "nproc_per_node": 2,
            "backend": "gloo",
            "tp": 2,
            "dcp": 2,
        },
        "environment": {
            "torch": "2.13.0+cpu",
            "cuda": None,
            "nccl": None,
            "device_names": ["cpu"],
            "python": "3.11.9",
            "host": "node0",
        },
        "image": None,
        "sources": {"dcpqual": {"commit": "a" * 40, "tree": "b" * 40}},
        "suites": {"capture": {"passed": 3, "failed": 0, "skipped": 1, "errors": 0}},
        "signatures": [signature_row("kimi-k3", KIMI)],
        "capture": {"lazy_events": 0, "by_detector": {}, "per_rank": {0: 0, 1: 0}},
        "negative_control": {"expected": 2, "detected": 2, "lazy_events": 2},
        "root_cause": None,
        "limitations": ["CPU run"],
        "ranks": {"expected": 2, "reported": 2, "complete": 2},
        "warm_impl": "vendored",
    }
    data.update(copy.deepcopy(changes))
    return data


def before_kimi() -> dict[str, Any]:
    """What `--warm-impl before-kimi` leaves: the Kimi signature created lazily in capture."""
    events = [
        {
            "rank": r,
            "test": "suites/capture/test_capture.py::test_capture_has_no_lazy_work[kimi-k3]",
            "detector": "transport-registry",
            "what": "registry miss in get",
            "signature": KIMI_WORDS,
        }
        for r in (0, 1)
    ]
    return receipt(
        verdict="fail",
        status="not-qualified",
        warm_impl="before-kimi",
        suites={"capture": {"passed": 2, "failed": 1, "skipped": 1, "errors": 0}},
        signatures=[signature_row("kimi-k3", KIMI, warmed=False)],
        capture={
            "lazy_events": 2,
            "by_detector": {"transport-registry": 2},
            "per_rank": {0: 1, 1: 1},
            "events": events,
        },
        root_cause={"rank": 0, "test": events[0]["test"], "message": "lazy specialization"},
    )


def test_signature_words_match_the_transport_signature() -> None:
    row = Receipt.from_json(receipt()).signatures[0]
    assert describe_signature(row) == KIMI_WORDS


def test_identical_receipts_do_not_regress() -> None:
    c = compare_receipts(receipt(), receipt())
    assert (c.regressions, c.improvements, c.identity, c.exit_code) == ((), (), (), 0)
    assert [s.change for s in c.signatures] == ["same"]


def test_before_kimi_against_vendored_is_exactly_the_kimi_regression() -> None:
    c = compare_receipts(receipt(), before_kimi())
    assert c.exit_code == 1
    assert c.regressions == (
        "verdict pass -> fail",
        "status source-qualified -> not-qualified",
        "suite capture: failed+errors 0 -> 1",
        f"lazy events in capture (transport-registry, {KIMI_WORDS}): 0 -> 2",
        f"kimi-k3 {KIMI_WORDS}: used in capture but not warmed",
    )
    (sig,) = c.signatures
    assert sig.change == "changed" and sig.head is not None and sig.head.lazy
    assert [(x.field, x.base, x.head) for x in c.identity] == [
        ("warm_impl", "vendored", "before-kimi")
    ]
    assert c.head.root_cause is not None and "lazy specialization" in c.head.root_cause


def test_the_fix_is_an_improvement_and_exits_0() -> None:
    c = compare_receipts(before_kimi(), receipt())
    assert c.exit_code == 0 and not c.regressions
    assert f"kimi-k3 {KIMI_WORDS}: no longer created lazily in capture" in c.improvements
    assert "verdict fail -> pass" in c.improvements


def test_status_going_down_regresses_even_when_both_pass() -> None:
    c = compare_receipts(receipt(status="qualified"), receipt())
    assert c.regressions == ("status qualified -> source-qualified",)


def test_a_suite_that_disappears_regresses_and_a_new_one_is_noted() -> None:
    tallies = {"passed": 1, "failed": 0, "skipped": 0, "errors": 0}
    c = compare_receipts(
        receipt(suites={"capture": tallies, "transport": tallies}),
        receipt(suites={"capture": tallies, "warmup": tallies}),
    )
    assert c.regressions == ("suite transport: missing in head",)
    assert c.notes == ("suite warmup: new in head",)


def test_undetected_negative_controls_regress() -> None:
    missed = {"expected": 2, "detected": 1, "lazy_events": 1, "missed": ["rank 1: t"]}
    c = compare_receipts(receipt(), receipt(negative_control=missed))
    assert c.regressions == ("negative controls not detected 0 -> 1",)


def test_new_signatures_and_identity_changes_are_reported_not_judged() -> None:
    other = TransportSignature(
        dtype="bf16", total_heads=128, query_head_dim=512, output_head_dim=512, dcp_world_size=2
    )
    head = receipt(
        signatures=[signature_row("kimi-k3", KIMI), signature_row("deepseek-v4", other)],
        image={"reference": "dcpqual/kimi:1", "digest": "sha256:" + "c" * 64},
        environment={**receipt()["environment"], "torch": "2.13.0+cu133"},
    )
    c = compare_receipts(receipt(), head)
    assert c.exit_code == 0
    assert [(s.model, s.change) for s in c.signatures] == [
        ("deepseek-v4", "new"),
        ("kimi-k3", "same"),
    ]
    fields = {x.field: (x.base, x.head) for x in c.identity}
    assert fields["environment.torch"] == ("2.13.0+cpu", "2.13.0+cu133")
    assert fields["image.digest"] == (None, "sha256:" + "c" * 64)


def test_geometry_mismatch_is_a_note() -> None:
    geometry = {**receipt()["geometry"], "world_size": 4, "nproc_per_node": 4}
    c = compare_receipts(receipt(), receipt(geometry=geometry))
    assert any(n.startswith("geometry differs") for n in c.notes)


def test_a_receipt_that_does_not_validate_is_unusable_input() -> None:
    with pytest.raises(UsageError, match="head receipt does not validate"):
        compare_receipts(receipt(), receipt(verdict="maybe"))


def test_markdown_names_the_receipts_and_keeps_run_text_inert() -> None:
    hostile = "boom `x` | @maintainer\n<img src=x> [link](http://e)"
    bad = before_kimi()
    bad["root_cause"]["message"] = hostile
    c = compare_receipts(
        receipt(), bad, base_ref=("b", "1" * 64, "2" * 64), head_ref=("h", "3" * 64, "4" * 64)
    )
    md = render_markdown(c)
    assert md.startswith("### dcpqual compare: REGRESSION\n")
    assert "`" + "1" * 64 + "`" in md and "`" + "3" * 64 + "`" in md
    (line,) = [x for x in md.splitlines() if x.startswith("| root cause")]
    assert line.count("|") - line.count("\\|") == 4  # the message added no table cells
    assert ": boom 'x' \\| @maintainer <img src=x> [link](http://e)` |" in line
    assert "\n<img" not in md and "\n@" not in md


def test_code_spans_are_one_line_and_bounded() -> None:
    assert code("a\n\nb") == "`a b`"
    assert code("") == ""
    assert len(code("x" * 1000)) <= 162


def test_text_and_json_forms() -> None:
    c = compare_receipts(receipt(), before_kimi())
    text = render_text(c)
    assert text.startswith("dcpqual compare: REGRESSION")
    assert "warm_impl: vendored -> before-kimi" in text
    data = json.loads(json.dumps(c.to_json()))
    assert data["schema"] == "dcpqual-compare/v1" and data["regressed"] is True
    assert data["signatures"][0]["head"] == {"warmed": False, "used_in_capture": True}
    assert data["lazy_events"] == [
        {"detector": "transport-registry", "signature": KIMI_WORDS, "base": 0, "head": 2}
    ]


# --- bundles on disk -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bundles")
    good, bad = root / "good", root / "bad"
    finalize_bundle(good, passing_run(good, world=2))
    finalize_bundle(bad, failing_run(bad, world=2, bad_rank=1))
    return good, bad


def test_load_bundle_refuses_missing_and_invalid_folders(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_bundle(tmp_path / "nope")
    (tmp_path / "receipt.json").write_text("{}")
    with pytest.raises(UsageError, match="is not a valid bundle"):
        load_bundle(tmp_path)


def test_load_bundle_refuses_an_edited_bundle(bundles: tuple[Path, Path], tmp_path: Path) -> None:
    import shutil

    copy_ = tmp_path / "edited"
    shutil.copytree(bundles[0], copy_)
    (copy_ / "summary.md").write_text("all good\n")
    with pytest.raises(UsageError, match="is not a valid bundle"):
        load_bundle(copy_)


def test_cli_exit_codes(bundles: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = bundles
    assert main(["compare", str(good), str(good)]) == 0
    assert main(["compare", str(bad), str(good)]) == 0
    assert main(["compare", str(good), str(bad)]) == 1
    capsys.readouterr()
    assert main(["compare", str(good), str(good.parent / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_markdown_and_json(
    bundles: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = bundles
    from harness.evidence.files import sha256_file

    assert main(["compare", str(good), str(bad), "--markdown"]) == 1
    md = capsys.readouterr().out
    assert md.startswith("### dcpqual compare: REGRESSION")
    assert sha256_file(good / "receipt.json") in md and sha256_file(bad / "receipt.json") in md
    assert main(["compare", str(good), str(bad), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["head"]["verdict"] == "fail" and "verdict pass -> fail" in data["regressions"]


def test_cli_refuses_two_output_forms(bundles: tuple[Path, Path]) -> None:
    good, _ = bundles
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(good), str(good), "--json", "--markdown"])
    assert exc.value.code == 2


def test_signature_words_match_for_fp8_queries_and_a2a() -> None:
    sig = dataclasses.replace(KIMI, query_dtype="fp8_e4m3fn", comm_backend="a2a")
    row = signature_row("kimi-k3", sig) | {"query_dtype": "fp8_e4m3fn", "comm_backend": "a2a"}
    data = receipt(signatures=[row])
    assert describe_signature(Receipt.from_json(data).signatures[0]) == sig.describe()


def test_the_json_form_is_every_field_of_the_comparison() -> None:
    """The whole `--json` value, key by key: its format is the one the compare schema commits."""
    data = json.loads(json.dumps(compare_receipts(receipt(), before_kimi()).to_json()))
    geometry = "2 ranks (1 x 2), gloo, tp=2 dcp=2"
    side = {"geometry": geometry, "receipt_sha256": "", "sums_sha256": ""}
    capture_test = "suites/capture/test_capture.py::test_capture_has_no_lazy_work[kimi-k3]"
    assert data == {
        "schema": "dcpqual-compare/v1",
        "regressed": True,
        "base": {
            **side,
            "path": "base",
            "root_cause": None,
            "status": "source-qualified",
            "verdict": "pass",
            "warm_impl": "vendored",
        },
        "head": {
            **side,
            "path": "head",
            "root_cause": f"rank 0, {capture_test}: lazy specialization",
            "status": "not-qualified",
            "verdict": "fail",
            "warm_impl": "before-kimi",
        },
        "identity": [{"field": "warm_impl", "base": "vendored", "head": "before-kimi"}],
        "improvements": [],
        "notes": [],
        "lazy_events": [
            {"detector": "transport-registry", "signature": KIMI_WORDS, "base": 0, "head": 2}
        ],
        "regressions": [
            "verdict pass -> fail",
            "status source-qualified -> not-qualified",
            "suite capture: failed+errors 0 -> 1",
            f"lazy events in capture (transport-registry, {KIMI_WORDS}): 0 -> 2",
            f"kimi-k3 {KIMI_WORDS}: used in capture but not warmed",
        ],
        "signatures": [
            {
                "model": "kimi-k3",
                "signature": KIMI_WORDS,
                "change": "changed",
                "base": {"warmed": True, "used_in_capture": True},
                "head": {"warmed": False, "used_in_capture": True},
            }
        ],
        "suites": [
            {
                "name": "capture",
                "base": {"passed": 3, "failed": 0, "skipped": 1, "errors": 0},
                "head": {"passed": 2, "failed": 1, "skipped": 1, "errors": 0},
            }
        ],
    }


def test_passes_that_became_skips_regress_with_their_count() -> None:
    """A 2-rank head against a 4-rank base: nothing failed, but 29 passes became skips."""
    base = {"passed": 40, "failed": 0, "skipped": 4, "errors": 0}
    head = {"passed": 11, "failed": 0, "skipped": 33, "errors": 0}
    c = compare_receipts(receipt(suites={"capture": base}), receipt(suites={"capture": head}))
    assert c.exit_code == 1
    assert c.regressions == (
        "suite capture: 29 passed test(s) no longer pass without failing (skipped or not "
        "run): passed 40 -> 11, skipped 4 -> 33",
    )


def test_passes_that_did_not_run_regress_and_failures_are_not_counted_twice() -> None:
    base = {"passed": 10, "failed": 0, "skipped": 0, "errors": 0}
    head = {"passed": 6, "failed": 1, "skipped": 0, "errors": 0}  # 1 failed, 3 never ran
    c = compare_receipts(receipt(suites={"capture": base}), receipt(suites={"capture": head}))
    assert "suite capture: failed+errors 0 -> 1" in c.regressions
    assert any(
        r.startswith("suite capture: 3 passed test(s) no longer pass") for r in c.regressions
    )


def test_more_passes_are_no_regression() -> None:
    base = {"passed": 6, "failed": 0, "skipped": 4, "errors": 0}
    head = {"passed": 10, "failed": 0, "skipped": 0, "errors": 0}
    c = compare_receipts(receipt(suites={"capture": base}), receipt(suites={"capture": head}))
    assert c.regressions == () and c.exit_code == 0
