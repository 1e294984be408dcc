"""Bundles written before this summary layout (tests/fixtures/bundles-v1) still verify and
compare: a nightly archive keeps working across the change. Each check still fires on them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.evidence.verify import verify_bundle
from harness.qualify.compare import compare_bundles, load_bundle

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bundles-v1"


@pytest.mark.parametrize("name", ["pass-2", "rank-left-nothing-2"])
def test_a_bundle_written_before_still_verifies(name: str, tmp_path: Path) -> None:
    copy = tmp_path / name
    shutil.copytree(FIXTURES / name, copy)
    result = verify_bundle(copy)
    assert result.problems == ()


def test_its_summary_is_still_held_to_its_receipt(tmp_path: Path) -> None:
    copy = tmp_path / "pass-2"
    shutil.copytree(FIXTURES / "pass-2", copy)
    summary = copy / "summary.md"
    summary.write_text(
        summary.read_text().replace("| verdict | **pass** |", "| verdict | **PASS!** |")
    )
    assert any(p.startswith("summary.md") for p in verify_bundle(copy).problems)


def test_a_bundle_written_before_compares_with_itself(tmp_path: Path) -> None:
    base = load_bundle(FIXTURES / "pass-2")
    comparison = compare_bundles(base, base)
    assert comparison.regressions == () and comparison.exit_code == 0
