"""What `dcpqual run` prints while the run goes holds no secret: the progress lines, the tee'd
ranks' lines and the ending lines are scrubbed with the bundle's own Scrubber (the secret
values of the launcher's environment, which the ranks inherit), on stdout and stderr alike.

The whole path through a real run (rank_secret.py with --tee) is in tests/test_security.py.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from harness.core.secrets import SCRUBBED
from harness.launch import launcher
from harness.launch.plan import RunOptions
from harness.launch.progress import PlainProgress
from harness.schema.launch import Launch
from harness.schema.rank_record import RankRecord, rank_record_path

SECRET = "hf_ConsoleSecret0123456789abcdef"


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    return SECRET


def test_a_teed_rank_line_reaches_the_console_scrubbed(tmp_path: Path, secret_env: str) -> None:
    torchrun_console = io.BytesIO(
        f"[default0]:HF_TOKEN={secret_env}\n"
        f"[default1]:not tee'd {secret_env}\n"
        f"[default0]:FAILED t.py::test - AssertionError: {secret_env!r}\n".encode()
    )
    console = io.StringIO()
    launcher._relay(torchrun_console, tmp_path / "agent.log", console, (0,))
    assert console.getvalue() == (
        f"[default0]:HF_TOKEN={SCRUBBED}\n"
        f"[default0]:FAILED t.py::test - AssertionError: '{SCRUBBED}'\n"
    )
    # torchrun's own log keeps every line; the out folder is scrubbed as the ending begins
    assert (tmp_path / "agent.log").read_text().count(secret_env) == 3


def launch_running_a_secret_test(
    plan, *, tick=None, tick_s=0.5, console=None, reader=None, hold=None
):  # type: ignore[no-untyped-def]
    """torchrun ran one rank, which is in a test whose id carries the secret when the launcher
    looks."""
    RankRecord(
        rank=0,
        world_size=1,
        local_rank=0,
        backend="gloo",
        hostname="node0",
        pid=1000,
        started_at="2026-11-29T18:00:00+00:00",
        collected=(f"t.py::test_token[{SECRET}]",),
        current_test=f"t.py::test_token[{SECRET}]",
    ).write(rank_record_path(plan.out_dir / "records", 0))
    assert tick is not None
    tick(0.1)
    return Launch(
        exit_code=1,
        started_at="s",
        finished_at="f",
        elapsed_s=0.2,
    )


def test_progress_and_ending_lines_reach_the_console_scrubbed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    secret_env: str,
) -> None:
    monkeypatch.setattr(launcher, "launch", launch_running_a_secret_test)
    out = tmp_path / f"run-{secret_env}"  # the folder's name is printed in every ending
    stream = io.StringIO()
    options = RunOptions(nproc_per_node=1, tp=1, out_dir=out)
    code = launcher.run(options, stream=stream, progress=PlainProgress(stream))

    assert code == 1
    printed, errors = stream.getvalue(), capsys.readouterr().err
    progress = [ln for ln in printed.splitlines() if ln.startswith("dcpqual run [")]
    assert progress and all(f"running t.py::test_token[{SCRUBBED}]" in ln for ln in progress)
    assert f"evidence: {tmp_path / f'run-{SCRUBBED}'}" in printed  # the ending
    assert secret_env not in printed and secret_env not in errors
