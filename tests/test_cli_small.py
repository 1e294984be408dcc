"""The small things a user meets at the terminal: a closed pipe ends quietly, every option of
every command has help, `signatures` refuses a bad geometry before importing torch."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support.evidence_factory import passing_run

from harness.cli import BROKEN_PIPE_EXIT, build_parser
from harness.evidence.writer import finalize_bundle

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pipe") / "bundle"
    finalize_bundle(out, passing_run(out, world=2))
    return out


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle's rank logs, as `dcpqual run` collects them."""
    out = tmp_path_factory.mktemp("logs") / "bundle"
    (out / "logs").mkdir(parents=True)
    for rank in range(2):
        (out / "logs" / f"rank-{rank:02d}.stdout").write_text(f"line of rank {rank}\n" * 5000)
    return out


def reader_gone(*argv: str) -> subprocess.CompletedProcess[str]:
    """The command with its stdout a pipe whose reader left at once (`| head` having read
    what it wanted): every write finds the pipe closed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *argv],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    return subprocess.CompletedProcess(argv, proc.wait(timeout=120), "", err)


@pytest.mark.parametrize(
    "argv",
    [("logs", "{l}"), ("compare", "{b}", "{b}", "--json"), ("compare", "{b}", "{b}")],
    ids=["logs", "compare-json", "compare-text"],
)
def test_a_reader_that_left_ends_the_command_quietly(
    bundle: Path, logs: Path, argv: tuple[str, ...]
):
    done = reader_gone(*(a.replace("{b}", str(bundle)).replace("{l}", str(logs)) for a in argv))
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.stderr == ""
    assert done.returncode == BROKEN_PIPE_EXIT


def _options(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str, object]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        elif action.dest != "help":
            yield path, action.dest, action.help


def test_every_option_of_every_command_has_help():
    missing = [(cmd, dest) for cmd, dest, text in _options(build_parser(), "dcpqual") if not text]
    assert missing == []


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--tp", "16", "--dcp", "5"], "dcp=5 does not divide tp=16"),
        (["--tp", "64", "--dcp", "4"], "kimi-k3 has 96 attention heads: at tp=64"),
    ],
)
def test_signatures_refuses_a_bad_geometry_before_importing_torch(argv, needle):
    code = (
        "import sys\n"
        "from harness.cli import main\n"
        f"code = main(['signatures', '--model', 'kimi-k3', *{argv!r}])\n"
        "print('torch' in sys.modules, code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.stdout.split() == ["False", "2"], done.stdout + done.stderr
    assert needle in done.stderr
