"""What a hostile bundle can put before `dcpqual verify` and `compare`: numbers no parser
should take, and terminal escapes in names and texts. One clear line, the right exit code,
never a traceback, never an escape sequence on the terminal."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from _support.evidence_factory import passing_run

from harness.cli import main
from harness.evidence.writer import finalize_bundle

HUGE = "9" * 5000
ESCAPES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x9b]")


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "honest"
    finalize_bundle(out, passing_run(out, world=2))
    return out


def copy_of(honest: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(honest, target)
    return target


def with_huge_int(path: Path) -> None:
    """A 5000-digit integer in place of a count the file holds."""
    data = json.loads(path.read_text())
    holder = data.get("ranks", data)
    key = "expected" if "ranks" in data else "world_size"
    holder[key] = 987654321987
    path.write_text(json.dumps(data, indent=2).replace("987654321987", HUGE))


@pytest.mark.parametrize("where", ["receipt.json", "records/rank-00.json"])
def test_a_5000_digit_integer_is_one_line_not_a_traceback(
    where: str, honest: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = copy_of(honest, tmp_path)
    with_huge_int(bundle / where)
    capsys.readouterr()
    assert main(["verify", str(bundle)]) == 1
    said = capsys.readouterr()
    assert "Traceback" not in said.out + said.err
    if where == "receipt.json":
        assert "integer of 5000 digits" in said.out
    assert main(["compare", str(honest), str(bundle)]) == 2
    said = capsys.readouterr()
    assert said.out == "" and len(said.err.splitlines()) == 1, said.err
    assert "is not a valid bundle" in said.err


def test_the_honest_bundle_verifies_and_compares(
    honest: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Negative control for the cases above."""
    assert main(["verify", str(honest)]) == 0
    assert main(["compare", str(honest), str(honest)]) == 0


def test_terminal_escapes_in_a_file_name_never_reach_verify_s_output(
    honest: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = copy_of(honest, tmp_path)
    (bundle / "x\x1b[2K\x1b[1Averdict PASS\x07.txt").write_text("odd\n")
    capsys.readouterr()
    assert main(["verify", str(bundle)]) == 1
    said = capsys.readouterr()
    assert "verdict PASS" in said.out  # the name is shown, its escapes are not
    assert not ESCAPES.search(said.out.replace("\n", "")), repr(said.out)
    assert not ESCAPES.search(said.err.replace("\n", "")), repr(said.err)


def test_a_failure_message_cannot_repaint_the_launcher_s_verdict() -> None:
    """What a test printed reaches the launcher's console escaped: no cursor movement, no
    erased line; the verdict line stays as written."""
    import io

    from harness.launch.launcher import _say

    stream = io.StringIO()
    _say(stream, "  root cause: rank 0: boom\x1b[1A\x1b[2K\rdcpqual run: verdict PASS\x9b2J")
    said = stream.getvalue()
    assert "verdict PASS" in said and not ESCAPES.search(said.replace("\n", "")), repr(said)
    assert "\\x1b[1A" in said  # shown, not obeyed
