"""The out folder is claimed atomically: of runs started at the same instant on one empty
folder, exactly one gets in; the other is refused with one line, nothing written."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import UsageError
from harness.evidence.writer import prepare_out_dir, release_out_dir, take_out_dir


def _race(folder: Path, runs: int) -> list[str]:
    start = threading.Barrier(runs)
    said: list[str] = []

    def claim() -> None:
        start.wait()
        try:
            prepare_out_dir(folder)
            said.append("won")
        except UsageError as exc:
            said.append(str(exc))

    threads = [threading.Thread(target=claim) for _ in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return said


@pytest.mark.parametrize("premade", [True, False], ids=["empty-folder", "no-folder"])
def test_of_runs_started_at_once_on_one_folder_exactly_one_wins(
    tmp_path: Path, premade: bool
) -> None:
    for attempt in range(30):
        folder = tmp_path / f"out-{attempt}"
        if premade:
            folder.mkdir()
        said = _race(folder, 4)
        try:
            assert said.count("won") == 1, said
            assert all("another run" in s or "not empty" in s for s in said if s != "won")
            assert list(folder.iterdir()) == []
        finally:
            release_out_dir(folder)


def test_dcpqual_run_on_a_folder_another_run_holds_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = prepare_out_dir(tmp_path / "held")
    target = tmp_path / "test_x.py"  # a target that exists: only the folder is refused
    target.write_text("def test_x():\n    pass\n")
    try:
        code = main(["run", "--nproc-per-node", "2", "--out", str(folder), "--", str(target)])
        said = capsys.readouterr()
        assert code == 2 and said.out == ""
        assert said.err.count("\n") == 1 and "being used by another run" in said.err
        assert list(folder.iterdir()) == []
    finally:
        release_out_dir(folder)
    assert prepare_out_dir(folder) == folder  # once let go, the empty folder is usable
    release_out_dir(folder)


def test_another_node_takes_the_folder_only_once_its_claimant_is_gone(tmp_path: Path) -> None:
    """Node 0 holds its folder's claim for its whole run: node 1 cannot take it while node 0's
    process lives, and can once that process is gone (SIGKILL closes its descriptor)."""
    import subprocess
    import sys

    folder = tmp_path / "shared"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from harness.evidence.writer import prepare_out_dir; "
            f"prepare_out_dir({str(folder)!r}); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        assert not take_out_dir(folder)
        holder.kill()
        holder.wait()
        assert take_out_dir(folder)
        assert take_out_dir(folder)  # this process holds it already
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
        release_out_dir(folder)
