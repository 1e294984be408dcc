"""What the launcher hands the evidence writer: torchrun's error files, node results, progress."""

from __future__ import annotations

import io
import json
from pathlib import Path

from harness.evidence.torchrun_errors import first_torchrun_error, parse_error_file
from harness.launch.context import run_context
from harness.launch.plan import RunOptions, build_plan
from harness.launch.progress import PlainProgress, RichProgress, Snapshot, snapshot, wants_plain
from harness.launch.rankview import RecordReader
from harness.rank.rankfiles import write_error_file
from harness.schema.launch import Launch, NodeState
from harness.schema.rank_record import RankRecord, TestOutcome, rank_record_path

RESULT = Launch(
    exit_code=1,
    started_at="2026-01-01T00:00:00+00:00",
    finished_at="2026-01-01T00:01:00+00:00",
    elapsed_s=60.0,
)


def write_error(path: Path, rank: int | None, when: float, message: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    extra: dict = {"py_callstack": "tb", "timestamp": str(int(when))}
    if rank is not None:
        extra["dcpqual"] = {"rank": rank, "test": "t", "message": message, "time": when}
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": extra}}))


def test_error_files_in_both_of_torchs_shapes(tmp_path):
    ours = tmp_path / "torchrun/node-00/run/attempt_0/1/error.json"
    write_error(ours, 1, 100.25, "rank 1 in t: boom")
    err = parse_error_file(ours, tmp_path)
    assert err is not None
    assert (err.rank, err.message, err.time) == (1, "rank 1 in t: boom", 100.25)
    assert err.file == "torchrun/node-00/run/attempt_0/1/error.json"
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"message": "SIGSEGV", "timestamp": 7}))
    assert parse_error_file(plain, tmp_path).message == "SIGSEGV"  # type: ignore[union-attr]
    (tmp_path / "junk.json").write_text("{not json")
    assert parse_error_file(tmp_path / "junk.json", tmp_path) is None


def test_the_rank_s_error_file_names_its_rank_to_the_launcher(tmp_path, monkeypatch):
    """The rank writes its note through the schema's ErrorNote, the launcher reads it back."""
    path = tmp_path / "torchrun/node-00/run/attempt_0/3/error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    write_error_file(3, "suites/x.py::t", "boom", "Traceback ...")
    err = parse_error_file(path, tmp_path)
    assert err is not None and (err.rank, err.message) == (3, "rank 3 in suites/x.py::t: boom")
    note = json.loads(path.read_text())["message"]["extraInfo"]["dcpqual"]
    assert set(note) == {"rank", "test", "message", "time"} and err.time == note["time"]


def test_the_rank_keeps_its_first_note_and_replaces_a_file_its_child_left(tmp_path, monkeypatch):
    path = tmp_path / "torchrun/node-00/run/attempt_0/1/error.json"
    path.parent.mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    path.write_text(json.dumps({"message": {"message": "the child's", "extraInfo": {}}}))
    write_error_file(1, "suites/x.py::t", "first")
    write_error_file(1, "suites/x.py::u", "second")
    err = parse_error_file(path, tmp_path)
    assert err is not None and (err.rank, err.message) == (1, "rank 1 in suites/x.py::t: first")


def test_a_note_that_is_not_the_rank_s_names_no_rank(tmp_path):
    path = tmp_path / "error.json"
    extra = {"timestamp": "9", "dcpqual": {"rank": 2, "message": "m", "time": 1.0, "who": "me"}}
    path.write_text(json.dumps({"message": {"message": "boom", "extraInfo": extra}}))
    err = parse_error_file(path, tmp_path)
    assert err is not None and (err.rank, err.message, err.time) == (None, "boom", 9.0)
    path.write_text(json.dumps({"message": ["not", "torch's", "shape"]}))
    assert parse_error_file(path, tmp_path) is None


def test_first_error_is_the_earliest_over_every_node(tmp_path):
    write_error(tmp_path / "torchrun/node-00/r/attempt_0/0/error.json", 0, 200.0, "later")
    write_error(tmp_path / "torchrun/node-01/r/attempt_0/1/error.json", 3, 100.5, "first")
    err = first_torchrun_error(tmp_path)
    assert err is not None and (err.rank, err.message) == (3, "first")
    assert first_torchrun_error(tmp_path / "nothing-here") is None


def test_run_context_carries_the_launch_and_the_geometry(tmp_path):
    plan = build_plan(RunOptions(nproc_per_node=4, warm_impl="before-kimi"), tmp_path)
    write_error(tmp_path / "torchrun/node-00/r/attempt_0/1/error.json", 1, 5.0, "boom")
    ctx = run_context(plan, RESULT)
    assert (ctx.world_size, ctx.nproc_per_node, ctx.nnodes, ctx.tp, ctx.dcp) == (4, 4, 1, 16, 4)
    assert ctx.warm_impl == "before-kimi" and ctx.backend == "gloo"
    assert ctx.exit_code == 1 and not ctx.timed_out
    assert ctx.command == plan.argv and ctx.pytest_args == plan.targets
    assert ctx.torchrun_error is not None and ctx.torchrun_error.rank == 1
    assert ctx.extra.launch is not None
    assert ctx.extra.launch == RESULT


def marker(k: int, state: str = "finished", code: int | None = 0) -> NodeState:
    return NodeState.model_validate(
        {"node_rank": k, "nnodes": 2, "rdzv_endpoint": "h:1", "state": state, "exit_code": code}
    )


def test_a_failing_or_silent_node_fails_the_multi_node_run(tmp_path):
    options = RunOptions(nproc_per_node=2, nnodes=2, rdzv_endpoint="h:1", out_dir=tmp_path)
    plan = build_plan(options, tmp_path)
    ok = Launch(exit_code=0, elapsed_s=1.0)
    assert run_context(plan, ok, nodes={0: marker(0), 1: marker(1)}).exit_code == 0
    assert run_context(plan, ok, nodes={0: marker(0), 1: marker(1, code=1)}).exit_code == 1
    assert run_context(plan, ok, nodes={0: marker(0), 1: None}).exit_code == 1
    assert run_context(plan, ok, nodes={0: marker(0), 1: marker(1, "started")}).exit_code == 1


def write_record(out: Path, rank: int, **kw) -> None:
    rec = RankRecord(rank=rank, world_size=2, **kw)
    rec.write(rank_record_path(out / "records", rank))


def test_progress_snapshot_counts_tests_every_rank_finished(tmp_path):
    reader = RecordReader(tmp_path / "records", 2)
    assert snapshot(reader, 1.0) == Snapshot(1.0, 2)
    done = TestOutcome("a.py::t1", "passed")
    write_record(tmp_path, 0, collected=("a.py::t1", "a.py::t2"), tests=(done,))
    write_record(
        tmp_path,
        1,
        collected=("a.py::t1", "a.py::t2"),
        tests=(),
        current_test="a.py::t1",
    )
    snap = snapshot(reader, 3.0)
    assert (snap.done, snap.total, snap.alive, snap.reported) == (0, 2, 2, 2)
    assert snap.current == "a.py::t1"
    assert "tests 0/2" in snap.line() and "ranks alive 2/2" in snap.line()


def test_the_running_test_is_shown_without_its_folders_but_with_all_its_parameters(tmp_path):
    """The console scrub sees the whole parameter: a secret holding '/' is never cut in two."""
    reader = RecordReader(tmp_path / "records", 1)
    test = "suites/transport/test_x.py::test_auth[tok/en-value]"
    write_record(tmp_path, 0, collected=(test,), tests=(), current_test=test)
    assert snapshot(reader, 1.0).current == "test_x.py::test_auth[tok/en-value]"


def test_plain_progress_prints_only_on_change():
    stream = io.StringIO()
    progress = PlainProgress(stream, heartbeat_s=3600)
    progress.update(Snapshot(1.0, 4, reported=4, alive=4, done=0, total=3))
    progress.update(Snapshot(2.0, 4, reported=4, alive=4, done=0, total=3))
    progress.update(Snapshot(3.0, 4, reported=4, alive=3, done=1, total=3, failed=1))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert "tests 1/3" in lines[1] and "FAILED 1" in lines[1]


def test_the_live_line_shows_test_ids_as_they_are_not_as_markup():
    stream = io.StringIO()
    progress = RichProgress(stream)
    current = "suites/capture/test_capture.py::test_kimi[kimi-k3] [bold]"
    progress.close(Snapshot(1.0, 2, reported=2, alive=2, total=3, current=current))
    assert current in stream.getvalue()


def test_plain_lines_when_not_a_terminal_or_on_ci():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert wants_plain(io.StringIO(), {})
    assert wants_plain(Tty(), {"CI": "true"})
    assert not wants_plain(Tty(), {})
