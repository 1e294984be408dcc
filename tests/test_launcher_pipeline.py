"""The `dcpqual run` pipeline with a fake launch and a fake evidence writer: exit codes follow the
verdict, the bundle is verified, and multi-node runs share one folder through node markers."""

from __future__ import annotations

import io
import json
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import COMBINE_TEST, failing_run, passing_run

from harness.cli import main
from harness.errors import UsageError
from harness.evidence.writer import finalize_bundle
from harness.launch import launcher, nodes
from harness.launch.plan import RunOptions
from harness.launch.progress import PlainProgress
from harness.schema.launch import Launch
from harness.schema.receipt import NodeZeroGone, Receipt


def made_receipt(folder: Path, verdict: str) -> Receipt:
    """A real receipt with this verdict, from a synthetic 2-rank out folder (rank 1 fails)."""
    made = passing_run(folder, 2) if verdict == "pass" else failing_run(folder, 2, bad_rank=1)
    receipt = finalize_bundle(folder, made)
    assert receipt.verdict == verdict
    return receipt


@dataclass
class FakeEvidence:
    verdict: str = "pass"
    problems: list[str] = field(default_factory=list)
    contexts: list[Any] = field(default_factory=list)

    def api(self) -> launcher.Evidence:
        def prepare(path: Path) -> Path:
            if path.exists() and any(path.iterdir()):
                raise UsageError(f"evidence folder {path} is not empty")
            path.mkdir(parents=True, exist_ok=True)
            return path

        def finalize(out: Path, ctx: Any) -> Receipt:
            self.contexts.append(ctx)
            receipt = made_receipt(out.with_name(f"{out.name}-made"), self.verdict)
            (out / "receipt.json").write_text(receipt.model_dump_json())
            (out / "SHA256SUMS").write_text("")
            return receipt

        return launcher.Evidence(
            prepare_out_dir=prepare,
            default_out_dir=lambda: Path("unused"),
            finalize_bundle=finalize,
            verify_bundle=lambda out: list(self.problems),
        )


def fake_launch(exit_code: int = 0, timed_out: bool = False):
    """A launch that returns at once, after every node has joined (torchrun's rendezvous)."""
    calls: list[Any] = []

    def run(plan, *, tick=None, tick_s=0.5, console=None, reader=None, hold=None):
        calls.append(plan)
        deadline = time.monotonic() + 20
        everyone = range(plan.options.nnodes if plan.options.multi_node else 0)
        while any(nodes.read_marker(plan.out_dir, k) is None for k in everyone):
            assert time.monotonic() < deadline, "rendezvous never completed"
            time.sleep(0.05)
        if tick is not None:
            tick(0.1)
        return Launch(
            exit_code=exit_code, timed_out=timed_out, started_at="s", finished_at="f", elapsed_s=0.2
        )

    return run, calls


def run(options: RunOptions, evidence: FakeEvidence) -> tuple[int, str]:
    stream = io.StringIO()
    code = launcher.run(
        options, evidence=evidence.api(), stream=stream, progress=PlainProgress(stream)
    )
    return code, stream.getvalue()


@pytest.mark.parametrize(
    "verdict, exit_code, problems, expected",
    [
        ("pass", 0, [], 0),
        ("fail", 1, [], 1),
        ("pass", 1, [], 1),  # fail closed: a pass with a failed torchrun is not trusted
        ("pass", 0, ["SHA256SUMS: receipt.json hash mismatch"], 1),
    ],
)
def test_exit_code_follows_the_verified_verdict(
    tmp_path, monkeypatch, verdict, exit_code, problems, expected
):
    fake, calls = fake_launch(exit_code)
    monkeypatch.setattr(launcher, "launch", fake)
    evidence = FakeEvidence(verdict=verdict, problems=problems)
    code, text = run(RunOptions(nproc_per_node=2, out_dir=tmp_path / "out"), evidence)
    assert code == expected
    [ctx] = evidence.contexts
    assert ctx.exit_code == exit_code and ctx.world_size == 2
    assert calls[0].out_dir == (tmp_path / "out").absolute()
    assert f"verdict {verdict.upper()}" in text
    assert str(tmp_path / "out") in text
    if verdict == "fail":
        # the root cause is a test's failure: said once, as the first FAILED line
        assert f"FAILED {COMBINE_TEST} - rank 1: AssertionError: combine mismatch" in text
        assert "root cause:" not in text


def test_a_timed_out_run_never_exits_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "launch", fake_launch(0, timed_out=True)[0])
    code, _ = run(RunOptions(nproc_per_node=2, out_dir=tmp_path / "o"), FakeEvidence())
    assert code == 1


main_thread_only = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="needs the main thread"
)


@main_thread_only
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_while_strays_are_set_aside_is_the_interruption_the_receipt_names(
    tmp_path, monkeypatch, sig
):
    monkeypatch.setattr(launcher, "launch", fake_launch(0)[0])
    evidence = FakeEvidence(verdict="pass")
    api = evidence.api()
    api = replace(api, set_aside=lambda out: signal.raise_signal(sig) or [])
    before = signal.getsignal(sig)
    stream = io.StringIO()
    options = RunOptions(nproc_per_node=2, out_dir=tmp_path / "out")
    code = launcher.run(options, evidence=api, stream=stream, progress=PlainProgress(stream))
    assert code == 128 + sig
    [ctx] = evidence.contexts  # the bundle was still written
    assert ctx.extra.interrupted is not None and ctx.extra.interrupted.signal == sig.name
    assert signal.getsignal(sig) == before  # the run's own handlers are gone with it


@main_thread_only
def test_a_signal_after_the_receipt_was_composed_still_exits_as_interrupted(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "launch", fake_launch(0)[0])
    evidence = FakeEvidence(verdict="pass")
    api = evidence.api()
    verify = api.verify_bundle
    api = replace(api, verify_bundle=lambda out: signal.raise_signal(signal.SIGINT) or verify(out))
    stream = io.StringIO()
    options = RunOptions(nproc_per_node=2, out_dir=tmp_path / "out")
    code = launcher.run(options, evidence=api, stream=stream, progress=PlainProgress(stream))
    assert code == 130
    [ctx] = evidence.contexts
    assert ctx.extra.interrupted is None  # it came after the receipt: that says what it says
    assert "interrupted by SIGINT after the verdict was decided" in stream.getvalue()


def test_a_non_empty_out_is_refused_before_anything_runs(tmp_path, monkeypatch):
    fake, calls = fake_launch()
    monkeypatch.setattr(launcher, "launch", fake)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old evidence")
    with pytest.raises(UsageError, match="not empty"):
        run(RunOptions(nproc_per_node=2, out_dir=out), FakeEvidence())
    assert calls == [] and sorted(p.name for p in out.iterdir()) == ["keep.txt"]


SECRET = "hf_PipelineSecret0123456789abcdef"


@pytest.mark.parametrize(
    "error, why",
    [(MemoryError(), "MemoryError"), (RuntimeError(f"stuck at {SECRET}"), "RuntimeError: stuck")],
)
def test_an_unexpected_error_in_the_scrub_is_one_line_and_no_bundle(
    tmp_path, monkeypatch, capsys, error, why
):
    """Whatever stops the scrub, the folder it leaves may hold a secret: no bundle is written
    from it, and one line (itself scrubbed) says so."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setattr(launcher, "launch", fake_launch(0)[0])
    evidence = FakeEvidence()

    def scrub_fails(out: Path) -> Any:
        raise error

    api = replace(evidence.api(), scrub_out_dir=scrub_fails)
    out = tmp_path / "out"
    stream = io.StringIO()
    options = RunOptions(nproc_per_node=2, out_dir=out)
    code = launcher.run(options, evidence=api, stream=stream, progress=PlainProgress(stream))
    assert code == 1
    assert evidence.contexts == []  # no bundle was written from the unscrubbed folder
    assert not (out / "receipt.json").exists() and not (out / "SHA256SUMS").exists()
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"dcpqual run: error: no bundle written in {out.absolute()}: ")
    assert f"the scrub of secrets stopped ({why}" in line and SECRET not in line
    assert line.endswith("remove them before sharing this folder")


def test_an_unexpected_error_while_the_bundle_is_written_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launcher, "launch", fake_launch(0)[0])

    def finalize_fails(out: Path, ctx: Any) -> Receipt:
        raise MemoryError

    api = replace(FakeEvidence().api(), finalize_bundle=finalize_fails)
    out = tmp_path / "out"
    stream = io.StringIO()
    options = RunOptions(nproc_per_node=2, out_dir=out)
    code = launcher.run(options, evidence=api, stream=stream, progress=PlainProgress(stream))
    assert code == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"dcpqual run: error: could not finish the bundle in {out.absolute()}: MemoryError; "
        "written: none;"
    )


LOG = "torchrun/node-00/run/attempt_0/0/stdout.log"


def run_with_ranks_leaving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leave: Callable[[Path], None]
) -> tuple[int, Path]:
    """A real `dcpqual run` (evidence and all) whose 2 ranks logged a line, left what `leave`
    makes in the out folder and exited 0; its exit code and bundle."""

    def launch(plan, *, tick=None, tick_s=0.5, console=None, reader=None, hold=None) -> Launch:
        log = plan.out_dir / LOG
        log.parent.mkdir(parents=True)
        log.write_text("rank 0 said hello\n")
        leave(plan.out_dir)
        return Launch(exit_code=0, started_at="s", finished_at="f", elapsed_s=0.2)

    monkeypatch.setattr(launcher, "launch", launch)
    out = tmp_path / "out"
    stream = io.StringIO()
    options = RunOptions(nproc_per_node=2, tp=2, out_dir=out)
    evidence = launcher.Evidence.load()
    return launcher.run(
        options, evidence=evidence, stream=stream, progress=PlainProgress(stream)
    ), out


def test_links_a_rank_left_take_no_log_out_of_the_bundle_or_into_it(tmp_path, monkeypatch):
    """Ranks ran and left `logs` a link to a folder outside, and their stack dump a link to a
    file outside: the launcher writes no log through the one and copies none from the other.
    Both are set aside as strays (the run fails), and the bundle verifies."""
    outside, private = tmp_path / "outside", tmp_path / "private.txt"
    outside.mkdir()
    private.write_text("not for the bundle\n")

    def leave(out_dir: Path) -> None:
        (out_dir / "logs").symlink_to(outside, target_is_directory=True)
        (out_dir / "stacks").mkdir()
        (out_dir / "stacks" / "rank-01.txt").symlink_to(private)

    code, out = run_with_ranks_leaving(tmp_path, monkeypatch, leave)
    assert code == 1
    assert list(outside.iterdir()) == []
    assert (out / "logs").is_dir() and not (out / "logs").is_symlink()
    assert (out / "logs" / "rank-00.stdout").read_text() == "rank 0 said hello\n"
    assert not (out / "logs" / "rank-01.stacks").exists()
    strays = json.loads((out / "receipt.json").read_text())["run"]["extra"]["strays"]
    assert {(s["path"], s["kind"], s["action"]) for s in strays} == {
        ("logs", "symlink", "removed"),
        ("stacks/rank-01.txt", "symlink", "removed"),
    }
    assert main(["verify", str(out)]) == 0


def test_a_file_named_logs_a_rank_left_is_set_aside_and_the_logs_still_collected(
    tmp_path, monkeypatch
):
    def leave(out_dir: Path) -> None:
        (out_dir / "logs").write_text("a file where the launcher needs a folder\n")

    code, out = run_with_ranks_leaving(tmp_path, monkeypatch, leave)
    assert code == 1
    assert (out / "logs" / "rank-00.stdout").read_text() == "rank 0 said hello\n"
    assert (out / "strays" / "logs").read_text() == "a file where the launcher needs a folder\n"
    strays = json.loads((out / "receipt.json").read_text())["run"]["extra"]["strays"]
    assert strays == [{"path": "logs", "kind": "file", "action": "moved to strays/logs"}]
    assert main(["verify", str(out)]) == 0


def test_a_nodes_link_a_rank_left_takes_no_marker_out_of_the_folder(tmp_path, monkeypatch, capsys):
    """Node 1's ranks made `nodes` a link to a folder outside: its finished marker is not
    written through it, and the node says so in one line."""
    monkeypatch.setattr(launcher, "JOIN_WAIT_S", 5.0)
    out, outside = tmp_path / "shared", tmp_path / "outside"
    outside.mkdir()
    nodes.write_marker(out, nodes.started_marker(0, 2, "127.0.0.1:29999", "t0"))

    def launch(plan, *, tick=None, tick_s=0.5, console=None, reader=None, hold=None) -> Launch:
        shutil.rmtree(plan.out_dir / "nodes")
        (plan.out_dir / "nodes").symlink_to(outside, target_is_directory=True)
        return Launch(exit_code=0, started_at="s", finished_at="f", elapsed_s=0.2)

    monkeypatch.setattr(launcher, "launch", launch)
    options = RunOptions(
        node_rank=1, nnodes=2, nproc_per_node=2, rdzv_endpoint="127.0.0.1:29999", out_dir=out
    )
    code, _ = run(options, FakeEvidence())
    assert code == 1
    assert list(outside.iterdir()) == []
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"dcpqual run: error: could not write node 1's finished marker in {out}")


def test_two_nodes_share_one_folder_and_node0_finalizes_after_both(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "launch", fake_launch(0)[0])
    monkeypatch.setattr(launcher, "JOIN_WAIT_S", 20.0)
    monkeypatch.setattr(launcher, "NODE_WAIT_S", 20.0)
    out = tmp_path / "shared"
    evidence = FakeEvidence()
    base = {"nproc_per_node": 2, "nnodes": 2, "rdzv_endpoint": "127.0.0.1:29999", "out_dir": out}
    results: dict[int, tuple[int, str]] = {}

    def node(k: int) -> None:
        results[k] = run(RunOptions(node_rank=k, **base), evidence)

    second = threading.Thread(target=node, args=(1,))
    second.start()  # starts first and must wait for node 0 to own the folder
    time.sleep(0.3)
    node(0)
    second.join(60)
    assert results[0][0] == 0 and results[1][0] == 0
    assert "node 0's bundle says PASS" in results[1][1]
    assert "= 4 passed in 0.0s (PASS) =" in results[1][1]  # node 0's ending, told on node 1 too
    [ctx] = evidence.contexts  # only node 0 wrote the bundle
    assert ctx.extra.nodes is not None and sorted(ctx.extra.nodes) == ["0", "1"]
    assert all(m is not None and m.state == "finished" for m in ctx.extra.nodes.values())


def follow(out: Path, exit_code: int = 0) -> tuple[int, str]:
    """Node 1's ending, once node 0 has finished the bundle in `out`."""
    stream = io.StringIO()
    launch = Launch(exit_code=exit_code, started_at="s", finished_at="f", elapsed_s=0.1)
    return launcher._follow_node0(stream, out, launch), stream.getvalue()


def test_node_k_tells_node_0s_failure_and_exits_1(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    receipt = made_receipt(tmp_path / "made", "fail")
    (out / "receipt.json").write_text(receipt.model_dump_json())
    (out / "SHA256SUMS").write_text("")
    code, text = follow(out)
    assert code == 1
    assert text.startswith(f"dcpqual run: node 0's bundle says FAIL: {out}\n")
    assert f"FAILED {COMBINE_TEST} - rank 1: AssertionError: combine mismatch" in text
    assert f"rerun the failed tests: dcpqual run --rerun-failed {out}" in text


def test_node_k_does_not_pass_when_its_own_torchrun_failed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "receipt.json").write_text(made_receipt(tmp_path / "made", "pass").model_dump_json())
    (out / "SHA256SUMS").write_text("")
    assert follow(out, exit_code=0)[0] == 0
    assert follow(out, exit_code=1)[0] == 1


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"verdict": "pass"}', "receipt.json: schema: Field required"),
        ('{"verdict": "pass",', "receipt.json: "),
    ],
)
def test_node_k_refuses_a_receipt_that_is_not_one_at_once(tmp_path, monkeypatch, text, why):
    monkeypatch.setattr(launcher, "NODE_WAIT_S", 30.0)
    (tmp_path / "receipt.json").write_text(text)
    (tmp_path / "SHA256SUMS").write_text("")
    started = time.monotonic()
    code, said = follow(tmp_path)
    assert time.monotonic() - started < 5  # not read again until the deadline
    assert code == 1
    (line,) = said.splitlines()
    said_first = f"dcpqual run: node 0's bundle in {tmp_path} has no valid receipt: {why}"
    assert line.startswith(said_first)


def test_node_k_waits_for_sha256sums_then_gives_up_at_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "NODE_WAIT_S", 0.5)
    (tmp_path / "receipt.json").write_text(made_receipt(tmp_path / "m", "pass").model_dump_json())
    code, said = follow(tmp_path)  # no SHA256SUMS: node 0 has not finished the bundle
    assert code == 1
    assert said == f"dcpqual run: node 0 wrote no bundle in {tmp_path} within 0.5s\n"


def test_node_k_refuses_a_folder_of_another_run(tmp_path):
    nodes.write_marker(tmp_path, nodes.started_marker(0, 2, "10.0.0.1:1", "t0"))
    with pytest.raises(UsageError, match="belongs to another run"):
        nodes.join_out_dir(tmp_path, nnodes=2, endpoint="127.0.0.1:1", wait_s=1)


def test_node_k_without_a_shared_folder_stops_with_a_clear_error(tmp_path):
    started = time.monotonic()
    with pytest.raises(UsageError, match="shared by every node"):
        nodes.join_out_dir(tmp_path / "nowhere", nnodes=2, endpoint="h:1", wait_s=0.5)
    assert time.monotonic() - started < 5
    assert not (tmp_path / "nowhere").exists()


def test_node_k_refuses_a_finished_bundle(tmp_path):
    (tmp_path / "receipt.json").write_text("{}")
    with pytest.raises(UsageError, match="already holds a finished bundle"):
        nodes.join_out_dir(tmp_path, nnodes=2, endpoint="h:1", wait_s=1)


def test_node_markers_round_trip(tmp_path):
    marker = nodes.finished_marker(
        nodes.started_marker(1, 2, "h:1", "t0"),
        Launch(exit_code=3, timed_out=True, finished_at="t1"),
    )
    assert (marker.state, marker.exit_code, marker.timed_out) == ("finished", 3, True)
    assert (marker.started_at, marker.finished_at, marker.node_rank) == ("t0", "t1", 1)
    nodes.write_marker(tmp_path, marker)
    assert nodes.read_marker(tmp_path, 1) == marker
    assert nodes.read_marker(tmp_path, 0) is None


def test_a_marker_that_is_not_a_whole_valid_one_reads_as_none(tmp_path):
    nodes.write_marker(tmp_path, nodes.started_marker(0, 2, "h:1", "t0"))
    path = nodes.marker_path(tmp_path, 0)
    data = json.loads(path.read_text())
    for edited in ({**data, "surprise": 1}, {**data, "state": "halfway"}, {**data, "pid": -1}):
        path.write_text(json.dumps(edited))
        assert nodes.read_marker(tmp_path, 0) is None, edited
    path.write_text(json.dumps(data)[:-5])
    assert nodes.read_marker(tmp_path, 0) is None


def _node_1_alone(tmp_path: Path, monkeypatch, take: bool) -> tuple[int, str, FakeEvidence]:
    """Node 1 of a 2-node run whose node 0 started (its marker) and then wrote nothing;
    `take`: whether node 0's claim on the folder is free (its launcher gone)."""
    monkeypatch.setattr(launcher, "JOIN_WAIT_S", 5.0)
    monkeypatch.setenv(launcher.NODE_WAIT_ENV, "0.3")
    out = tmp_path / "shared"
    nodes.write_marker(out, nodes.started_marker(0, 2, "127.0.0.1:29999", "t0"))
    monkeypatch.setattr(launcher, "launch", fake_launch(1)[0])
    evidence = FakeEvidence(verdict="fail")
    api = replace(evidence.api(), take_out_dir=lambda path: take)
    options = RunOptions(
        node_rank=1, nnodes=2, nproc_per_node=1, rdzv_endpoint="127.0.0.1:29999", out_dir=out
    )
    stream = io.StringIO()
    code = launcher.run(options, evidence=api, stream=stream, progress=PlainProgress(stream))
    return code, stream.getvalue(), evidence


def test_node_1_writes_the_bundle_when_node_0_is_gone(tmp_path, monkeypatch):
    code, said, evidence = _node_1_alone(tmp_path, monkeypatch, take=True)
    assert code == 1
    assert "so node 0 is gone: node 1 writes the bundle (a failing one)" in said
    [ctx] = evidence.contexts  # node 1 wrote it, through the same writer node 0 uses
    assert ctx.extra.node_zero_gone == NodeZeroGone(waited_s=0.3, by_node=1)
    assert ctx.extra.nodes is not None and ctx.extra.nodes["0"].state == "started"
    assert ctx.exit_code == 1  # node 0 never said how its torchrun ended


def test_node_1_writes_nothing_while_node_0_holds_its_folder(tmp_path, monkeypatch):
    """A node 0 alive (its claim held) writes the bundle itself, however late: node 1 only
    waits for it, so one receipt results."""
    code, said, evidence = _node_1_alone(tmp_path, monkeypatch, take=False)
    assert code == 1
    assert evidence.contexts == []
    assert said.splitlines()[-1] == (
        f"dcpqual run: node 0 wrote no bundle in {tmp_path / 'shared'} within 0.3s"
    )


def test_node_1_leaves_a_finished_node_0_to_write_its_bundle(tmp_path, monkeypatch):
    out = tmp_path / "shared"
    started = nodes.started_marker(0, 2, "127.0.0.1:29999", "t0")
    monkeypatch.setenv(launcher.NODE_WAIT_ENV, "0.3")
    nodes.write_marker(out, nodes.finished_marker(started, Launch(exit_code=0)))
    stream = io.StringIO()
    taken: list[Path] = []
    api = replace(FakeEvidence().api(), take_out_dir=lambda path: taken.append(path) or True)
    options = RunOptions(
        node_rank=1, nnodes=2, nproc_per_node=1, rdzv_endpoint="127.0.0.1:29999", out_dir=out
    )
    assert not launcher._node_zero_gone(stream, options, api, out, 0.3)
    assert taken == []


@pytest.mark.parametrize("text", ["0", "-1", "soon", "inf", "nan"])
def test_a_bad_node_wait_is_one_line_before_anything_is_touched(tmp_path, monkeypatch, text):
    monkeypatch.setenv(launcher.NODE_WAIT_ENV, text)
    options = RunOptions(
        node_rank=0,
        nnodes=2,
        nproc_per_node=1,
        rdzv_endpoint="127.0.0.1:29999",
        out_dir=tmp_path / "o",
    )
    with pytest.raises(UsageError, match=f"{launcher.NODE_WAIT_ENV} must be seconds above 0"):
        run(options, FakeEvidence())
    assert not (tmp_path / "o").exists()
