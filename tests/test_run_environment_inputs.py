"""Inputs a run takes from its environment are checked before anything launches: a malformed
`DCPQUAL_IMAGE_IDENTITY` is one line and exit 2, not a whole suite run thrown away when the
receipt is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _support.identities import make_identity

from harness.cli import main
from harness.image.identity import IDENTITY_ENV
from harness.launch import launcher
from harness.launch.plan import RunOptions

ARGV = ["run", "--nproc-per-node", "2", "--tp", "2", "--", "suites"]


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[RunOptions]:
    seen: list[RunOptions] = []
    monkeypatch.setattr(launcher, "run", lambda options, **kw: seen.append(options) or 0)
    return seen


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("{not json", "is not strict JSON"),
        ('{"schema": "something-else"}', "not an image identity"),
        ("[1, 2]", "not an image identity"),
        ('{"a": ' + "9" * 5000 + "}", "integer of 5000 digits"),
    ],
)
def test_a_malformed_image_identity_is_refused_before_the_launch(
    value: str, said: str, launched, monkeypatch, capsys
) -> None:
    monkeypatch.setenv(IDENTITY_ENV, value)
    assert main(ARGV) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("dcpqual run: error: $DCPQUAL_IMAGE_IDENTITY") and said in line
    assert launched == []


def test_a_well_formed_identity_or_none_launches(launched, monkeypatch, tmp_path: Path) -> None:
    """Negative control."""
    monkeypatch.delenv(IDENTITY_ENV, raising=False)
    assert main(ARGV) == 0
    lock = tmp_path / "source-lock.json"
    lock.write_text("{}")
    identity = make_identity(lock)
    monkeypatch.setenv(IDENTITY_ENV, json.dumps(identity.to_json()))
    assert main(ARGV) == 0 and len(launched) == 2
