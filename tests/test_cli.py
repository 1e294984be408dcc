"""The `dcpqual` entry point's own error line: one line on stderr, scrubbed of secrets as the
launcher's console is (an error may echo an argument, a path or what a file holds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.core.secrets import SCRUBBED

TOKEN = "hf_cli0secret0123456789"


def test_an_error_that_echoes_a_secret_prints_it_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    code = main(["lock", "check", str(tmp_path / f"lock-{TOKEN}.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("dcpqual lock: error: ") and err.count("\n") == 1
    assert TOKEN not in err and f"lock-{SCRUBBED}.json" in err


def test_an_error_naming_a_secret_variable_prints_its_value_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The value is in no variable of this process: the text names it a secret."""
    code = main(["verify", str(tmp_path / "HF_TOKEN=hf_elsewhere")])
    err = capsys.readouterr().err
    assert code == 2 and "hf_elsewhere" not in err and f"HF_TOKEN={SCRUBBED}" in err


def test_an_argument_error_that_echoes_a_secret_prints_it_redacted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with pytest.raises(SystemExit) as exit_:
        main(["signatures", "--model", "kimi-k3", "--tp", TOKEN, "--dcp", "1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "invalid int value" in err
    assert TOKEN not in err and SCRUBBED in err
