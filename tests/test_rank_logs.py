"""Rank logs by global rank (logs/rank-NN.*) and `dcpqual logs`, on torchrun's real layout
(torchrun/node-KK/<run id>/attempt_0/<local rank>/stdout.log) built by hand."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.launch.progress import Snapshot, slowest
from harness.launch.ranklogs import collect_rank_logs
from harness.schema.rank_record import RankRecord, rank_record_path


def torchrun_log(out: Path, node: int, local: int, stream: str, text: str) -> None:
    path = out / "torchrun" / f"node-{node:02d}" / "abc_1" / "attempt_0" / str(local)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{stream}.log").write_text(text)


def two_by_two(out: Path, *, swapped: bool) -> None:
    """2 nodes x 2 ranks; `swapped`: the rendezvous gave node-01's agent ranks 0 and 1."""
    for node in (0, 1):
        for local in (0, 1):
            owner = (1 - node if swapped else node) * 2 + local
            torchrun_log(out, node, local, "stdout", f"out of rank {owner}\n")
            torchrun_log(out, node, local, "stderr", f"err of rank {owner}\n")
            RankRecord(
                rank=owner, world_size=4, local_rank=local, node_rank=0, extra={"node_index": node}
            ).write(rank_record_path(out / "records", owner))
    (out / "stacks").mkdir()
    (out / "stacks" / "rank-03.txt").write_text("=== rank 3 stack\n")


@pytest.mark.parametrize("swapped", [False, True])
def test_logs_are_named_by_the_global_rank_each_rank_reported(tmp_path: Path, swapped: bool):
    two_by_two(tmp_path, swapped=swapped)
    written = collect_rank_logs(tmp_path, world_size=4, nproc_per_node=2)
    assert len(written) == 8  # stdout and stderr; the stack dump stays stacks/rank-03.txt alone
    assert not (tmp_path / "logs" / "rank-03.stacks").exists()
    for rank in range(4):
        assert (
            tmp_path / "logs" / f"rank-{rank:02d}.stdout"
        ).read_text() == f"out of rank {rank}\n"
        assert (
            tmp_path / "logs" / f"rank-{rank:02d}.stderr"
        ).read_text() == f"err of rank {rank}\n"


def test_a_rank_without_a_record_is_placed_by_the_launch_layout(tmp_path: Path):
    torchrun_log(tmp_path, 1, 1, "stdout", "died early\n")
    collect_rank_logs(tmp_path, world_size=4, nproc_per_node=2)
    assert (tmp_path / "logs" / "rank-03.stdout").read_text() == "died early\n"


def test_a_logs_link_is_never_written_through(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    torchrun_log(out, 0, 0, "stdout", "hello\n")
    (out / "logs").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OSError, match="is a link"):
        collect_rank_logs(out, world_size=1, nproc_per_node=1)
    assert list(outside.iterdir()) == []


def test_a_log_or_stack_dump_that_is_a_link_is_not_copied(tmp_path: Path):
    """What a link points to is not the rank's output: it could be any file the run may read."""
    private = tmp_path / "private.txt"
    private.write_text("not for the bundle\n")
    out = tmp_path / "out"
    torchrun_log(out, 0, 0, "stdout", "rank 0\n")
    torchrun_log(out, 0, 1, "stderr", "")
    (out / "torchrun" / "node-00" / "abc_1" / "attempt_0" / "1" / "stderr.log").unlink()
    (out / "torchrun" / "node-00" / "abc_1" / "attempt_0" / "1" / "stderr.log").symlink_to(private)
    (out / "stacks").mkdir()
    (out / "stacks" / "rank-00.txt").symlink_to(private)
    (out / "torchrun" / "node-01").symlink_to(out / "torchrun" / "node-00")
    written = collect_rank_logs(out, world_size=4, nproc_per_node=2)
    assert written == ["logs/rank-00.stdout"]


def test_dcpqual_logs_reads_one_rank_a_stream_or_a_pattern(tmp_path: Path, capsys):
    two_by_two(tmp_path, swapped=True)
    collect_rank_logs(tmp_path, world_size=4, nproc_per_node=2)
    assert main(["logs", str(tmp_path), "--rank", "2"]) == 0
    assert capsys.readouterr().out == "==> rank 2 (logs/rank-02.stdout) <==\nout of rank 2\n"
    assert main(["logs", str(tmp_path), "--stderr", "--grep", "rank [13]$"]) == 0
    assert (
        capsys.readouterr().out
        == "rank-01.stderr:1:err of rank 1\nrank-03.stderr:1:err of rank 3\n"
    )
    assert main(["logs", str(tmp_path), "--stacks"]) == 0
    assert "rank 3 stack" in capsys.readouterr().out
    assert main(["logs", str(tmp_path), "--grep", "nowhere"]) == 1
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--rank", "9"], "no logs/rank-09.stdout in"),
        (["--rank", "x"], "--rank must be an integer"),
        (["--grep", "("], "is not a regular expression"),
    ],
)
def test_dcpqual_logs_bad_input_is_one_line(tmp_path: Path, capsys, argv, needle):
    two_by_two(tmp_path, swapped=False)
    collect_rank_logs(tmp_path, world_size=4, nproc_per_node=2)
    assert main(["logs", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_dcpqual_logs_says_so_when_the_bundle_has_none_of_that_stream(tmp_path: Path, capsys):
    """A passing run dumps no stacks: printing nothing with exit 0 would read as "all shown"."""
    two_by_two(tmp_path, swapped=False)
    shutil.rmtree(tmp_path / "stacks")
    collect_rank_logs(tmp_path, world_size=4, nproc_per_node=2)
    assert main(["logs", str(tmp_path), "--stacks"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [
        f"dcpqual logs: error: {tmp_path} has no stacks/rank-NN.txt files"
    ]
    assert main(["logs", str(tmp_path), "--rank", "0"]) == 0  # the other streams are there


def test_dcpqual_logs_refuses_a_folder_without_logs(tmp_path: Path, capsys):
    assert main(["logs", str(tmp_path)]) == 2
    assert "has no logs/ folder" in capsys.readouterr().err


def at(rank: int, test: str | None, waiting_since: float | None) -> RankRecord:
    return RankRecord(rank=rank, world_size=4, current_test=test, waiting_since=waiting_since)


def test_progress_names_the_ranks_others_wait_on_and_for_how_long():
    records = [at(0, "t", 100.0), at(1, "t", None), at(2, "t", 104.0), at(3, "t", None)]
    assert slowest(records, now=112.0) == ((1, 3), 12.0)
    snap = Snapshot(elapsed_s=30.0, world_size=4, done=3, total=9, behind=(1, 3), waited_s=12.0)
    line = snap.line()
    assert "waiting 12s on rank(s) 1, 3" in line
    assert "ETA 60s" in line  # 30 s for 3 tests, 6 left


def test_progress_names_nobody_while_no_rank_waits():
    assert slowest([at(0, "t", None), at(1, "t", None)], now=5.0) == ((), 0.0)
    assert slowest([at(0, None, None), at(1, None, None)], now=5.0) == ((), 0.0)
    assert slowest([at(0, "t", 1.0), at(1, "t", 2.0)], now=5.0) == ((), 0.0)
    line = Snapshot(elapsed_s=3.0, world_size=2, done=0, total=4).line()
    assert "waiting" not in line and "ETA" not in line
