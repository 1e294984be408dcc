"""The in-image identity check: honest mismatches here (CPU torch, no CUDA), a pass on a match."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _support.locks import TEMPLATE, pinned_lock_data, write_lock

from harness.image import verify_runtime
from harness.image.lock import load_pinned_lock
from harness.image.verify_runtime import compare, expected_from, verify
from harness.schema.image import ExpectedRuntime, GateTally, ImageRuntime, ObservedRuntime


def _gate(component: str, where: str, **change: object) -> dict[str, object]:
    """One source gate's tallies as `python -m harness.image.gates` writes them (a pass)."""
    return {"component": component, "where": where, "tests": ["tests/test_x.py"], "ran": True,
            "exit_code": 0, "passed": 3, "failed": 0, "skipped": 1, "errors": 0,
            "note": None, **change}  # fmt: skip


def fake_image_root(root: Path, lock_file: Path) -> Path:
    """Provenance files and build.json exactly as the Dockerfile writes them."""
    data = json.loads(lock_file.read_text())
    (root / "sources").mkdir(parents=True)
    for name, comp in data["components"].items():
        src = comp["source"]
        record = {"name": name, "repository": src["repository"], "commit": src["commit"],
                  "tree": src["tree"]}  # fmt: skip
        (root / "sources" / f"{name}.json").write_text(json.dumps(record))
    gates = [_gate(g["component"], "cpu") for g in data["source_gates"] if g["where"] == "cpu"]
    (root / "source-gates-cpu.json").write_text(json.dumps(gates))
    sha = hashlib.sha256(lock_file.read_bytes()).hexdigest()
    build = {"lock_sha256": sha, "harness": {"commit": "c" * 40, "tree": "d" * 40, "dirty": False}}
    (root / "build.json").write_text(json.dumps(build))
    return root


def test_here_it_reports_cpu_torch_and_no_cuda(tmp_path: Path) -> None:
    report = verify(TEMPLATE, image_root=tmp_path / "no-image")
    assert report.ok is False
    text = "\n".join(report.mismatches)
    assert f"torch: expected 2.13.0, found {torch.__version__}" in text
    assert "cuda: expected 13.3, found none" in text
    assert "cuda arch: expected only sm_120a, found none" in text
    assert "source pytorch: no provenance in the image" in text
    assert "lock: foundation.image.digest" in text  # the template lock itself is not pinned
    assert report.observed.cuda is None and report.observed.cuda_available is False


def test_pinned_lock_with_matching_provenance_still_fails_on_cpu_torch(tmp_path: Path) -> None:
    lock_file = write_lock(tmp_path / "source.lock.json", pinned_lock_data())
    root = fake_image_root(tmp_path / "image", lock_file)
    report = verify(lock_file, image_root=root)
    assert report.ok is False
    assert not [m for m in report.mismatches if m.startswith(("source ", "lock"))]
    assert any(m.startswith("torch: ") for m in report.mismatches)
    assert any(m.startswith("nccl: expected 2.28.9, found none") for m in report.mismatches)
    assert report.image_lock_sha256 == report.lock_sha256
    assert report.observed.harness is not None and report.observed.harness.dirty is False
    assert sorted(report.observed.sources) == sorted(report.expected.sources)


def test_a_provenance_file_that_is_not_one_is_a_note_and_no_provenance(tmp_path: Path) -> None:
    lock_file = write_lock(tmp_path / "source.lock.json", pinned_lock_data())
    root = fake_image_root(tmp_path / "image", lock_file)
    (root / "sources" / "b12x.json").write_text(json.dumps({"commit": "a" * 40, "surprise": 1}))
    report = verify(lock_file, image_root=root)
    assert "source b12x: no provenance in the image" in report.mismatches
    assert any("b12x.json: not a provenance record: surprise" in n for n in report.observed.notes)


def _matching(lock_file: Path) -> tuple[ExpectedRuntime, ObservedRuntime]:
    expected = expected_from(load_pinned_lock(lock_file))
    observed = ObservedRuntime(
        torch="2.13.0",
        torch_commit=expected.torch_commit,
        cuda="13.3",
        nccl="2.28.9",
        arch=["sm_120a"],
        cuda_available=True,
        devices=["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 16,
        packages={"vllm": "0.32.1.dev0", "b12x": "1.5.1"},
        sources=expected.sources,
        image_lock_sha256="a" * 64,
        harness=None,
        source_gates=[
            GateTally.model_validate(_gate(*key.split("/"))) for key in expected.source_gates
        ],
    )
    return expected, observed


def test_compare_passes_only_when_everything_matches(tmp_path: Path) -> None:
    expected, good = _matching(write_lock(tmp_path / "source.lock.json", pinned_lock_data()))
    assert compare(expected, good, "a" * 64) == []
    wrong_tree = {
        **good.sources,
        "b12x": good.sources["b12x"].model_copy(update={"tree": "0" * 40}),
    }
    cases = {
        "torch: expected 2.13.0, found 2.13.0+cu133": {"torch": "2.13.0+cu133"},
        "torch commit: expected": {"torch_commit": "0" * 40},
        "cuda: expected 13.3, found 13.0": {"cuda": "13.0"},
        "nccl: expected 2.28.9, found 2.27.3": {"nccl": "2.27.3"},
        "cuda arch: expected only sm_120a, found sm_90 sm_120a": {"arch": ["sm_90", "sm_120a"]},
        "source b12x: tree expected": {"sources": wrong_tree},
        "package vllm: not installed": {"packages": {"vllm": None, "b12x": "1.5.1"}},
        "lock sha256: expected": {"image_lock_sha256": "b" * 64},
        "source gate vllm/cpu: did not run in the image build": {
            "source_gates": [g for g in good.source_gates if g.key != "vllm/cpu"]
        },
        "source gate b12x/cpu: 3 passed, 1 failed, 0 errors (exit 1)": {
            "source_gates": [
                g.model_copy(update={"failed": 1, "exit_code": 1}) if g.key == "b12x/cpu" else g
                for g in good.source_gates
            ]
        },
        "source gate b12x/cpu: no tests ran": {
            "source_gates": [
                g.model_copy(update={"passed": 0, "skipped": 4, "note": "no tests ran"})
                if g.key == "b12x/cpu"
                else g
                for g in good.source_gates
            ]
        },
    }
    for needle, change in cases.items():
        got = compare(expected, good.model_copy(update=change), "a" * 64)
        assert len(got) == 1 and got[0].startswith(needle), (needle, got)


def test_cli_json_report_and_exit_codes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness.image.verify_runtime", "--json", "--lock", str(TEMPLATE),
         "--image-root", str(tmp_path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["schema"] == "dcpqual-image-runtime/v1" and report["ok"] is False
    assert report["observed"]["torch"] == torch.__version__
    assert report["mismatches"] and done.stderr.count("mismatch: ") == len(report["mismatches"])
    missing = verify_runtime.main(["--lock", str(tmp_path / "absent.json")])
    assert missing == 2


def test_default_lock_is_the_image_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DCPQUAL_LOCK", raising=False)
    assert verify_runtime.default_lock_path() == Path(
        "images/kimi-k3-cu133-torch213/source.lock.json"
    )
    monkeypatch.setenv("DCPQUAL_LOCK", "/x/source.lock.json")
    assert verify_runtime.default_lock_path() == Path("/x/source.lock.json")


def test_the_gpu_gates_that_did_not_run_block_qualification(tmp_path: Path) -> None:
    """The build runs the CPU gates; the GPU gates run on the node, and until they ran and
    passed the image cannot back a qualified receipt (a limitation, not a pass)."""
    from _support.identities import make_identity

    lock_file = write_lock(tmp_path / "source.lock.json", pinned_lock_data())
    expected, good = _matching(lock_file)
    assert expected.source_gates == ["b12x/cpu", "b12x/gpu", "vllm/cpu", "vllm/gpu"]
    cpu_only = [g for g in good.source_gates if g.where == "cpu"]
    runtime = ImageRuntime(ok=True, expected=expected, observed=good.model_copy(
        update={"source_gates": cpu_only}))  # fmt: skip
    identity = make_identity(lock_file)
    identity = identity.model_copy(
        update={"runtime": runtime.model_copy(update={"lock_sha256": identity.source_lock_sha256})}
    )
    blockers = identity.qualification_blockers()
    assert blockers == [
        "source gate b12x/gpu did not run and pass",
        "source gate vllm/gpu did not run and pass",
    ]
    full = runtime.model_copy(update={"lock_sha256": identity.source_lock_sha256, "observed": good})
    assert identity.model_copy(update={"runtime": full}).qualification_blockers() == []
