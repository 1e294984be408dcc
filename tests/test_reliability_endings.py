"""Every ending of a real `dcpqual run` leaves a scrubbed bundle `dcpqual verify` accepts, or one
clear line: ^C, SIGTERM, odd files a test left in the out folder (a `logs` link to a folder
outside among them), a full disk, an unusable `--out`, an absurd world size, a rank that left
mid-suite with exit code 0, a daemon a rank double-forked (which fails the run), a thread a
test left running (which does not hold the run), and secrets printed the ways tools print them.

World 2, but a rank gone mid-suite and ^C at 16 ranks (`sixteen_ranks`: `nox -s cpu16` runs
them): the root cause at a rank above 9, and the ending of a 16-rank tree (each shows all that
the same fault at 2 ranks would). Each
protection is shown to fail when removed in tests/test_launcher_endings.py (subreaper, the
hold's hurry, dead-rank watch) and tests/test_evidence_redact.py (print forms).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from _support.leaks import leaks, main_thread_only, signal_when_running
from _support.runs import SUITES, processes_of_run, receipt, records, run, run_with_folder

from harness.cli import main
from harness.evidence import writer
from harness.launch import ending
from harness.launch.proctree import identify
from harness.rank.outrelay import RELAY_NAME

pytestmark = [pytest.mark.torchrun]


def assert_interrupted_bundle(out: Path, code: int, sig: signal.Signals, token: str) -> None:
    assert code == 128 + sig
    assert (out / "SHA256SUMS").is_file()
    data = receipt(out)
    assert data["verdict"] == "fail" and data["status"] == "not-qualified"
    cause = data["root_cause"]
    assert cause["kind"] == "interrupted", cause
    assert f"interrupted by {sig.name}" in cause["message"]
    assert "with 1 of 3 collected tests finished on every rank" in cause["message"], cause
    assert "test_waits_for_the_interrupt running" in cause["message"], cause
    interrupted = data["run"]["extra"]["launch"]["interrupted"]
    assert interrupted["signal"] == sig.name and interrupted["at"]
    assert main(["verify", str(out)]) == 0, "verify rejects the interrupted run's bundle"
    assert leaks(out, token) == []
    assert processes_of_run(out) == []


@main_thread_only
@pytest.mark.parametrize(
    ("sig", "nranks"),
    [
        pytest.param(signal.SIGINT, 16, marks=pytest.mark.sixteen_ranks, id="ctrl-c-16-ranks"),
        pytest.param(signal.SIGTERM, 2, id="sigterm-2-ranks"),
    ],
)
def test_an_interrupted_run_leaves_a_scrubbed_bundle_naming_the_interruption(
    sig: signal.Signals, nranks: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """^C at 16 ranks (a whole 16-rank tree ended, ranks above 9 among them), which shows all
    that a ^C at 2 ranks would, and SIGTERM at 2."""
    token = f"hf_interrupt{uuid.uuid4().hex}"
    monkeypatch.setenv("HF_TOKEN", token)
    out = tmp_path / "bundle"
    sender = signal_when_running(out, nranks, "test_waits_for_the_interrupt", sig)
    code, elapsed = run(out, nranks, "rank_interrupt.py")
    sender.join()
    assert elapsed < 90
    assert_interrupted_bundle(out, code, sig, token)


def signal_me_first(func: Any, *sigs: signal.Signals, when: Any = None) -> Any:
    """`func`, which first sends this process (the launcher) `sigs`, the first time `when`
    (its arguments) says so: a signal at a chosen moment after torchrun has exited."""
    sent: list[bool] = []

    def signalled(*args: Any, **kwargs: Any) -> Any:
        if not sent and (when is None or when(*args)):
            sent.append(True)
            for sig in sigs:
                os.kill(os.getpid(), sig)
                time.sleep(0.05)  # each one reaches the handler before the next is sent
        return func(*args, **kwargs)

    return signalled


@main_thread_only
@pytest.mark.parametrize(
    ("moment", "sigs", "suite"),
    [
        ("scrub", (signal.SIGTERM,), "rank_pass.py"),
        # a second ^C does not abort the bundle either
        ("scrub", (signal.SIGINT, signal.SIGINT), "rank_pass.py"),
        ("tree-cleanup", (signal.SIGINT,), "rank_secret.py"),  # spills HF_TOKEN; rank 1 fails
    ],
    ids=["sigterm-at-scrub", "ctrl-c-twice-at-scrub", "ctrl-c-at-tree-cleanup"],
)
def test_a_signal_after_torchrun_exited_is_held_until_the_bundle_verifies_and_named_in_it(
    moment: str,
    sigs: tuple[signal.Signals, ...],
    suite: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Every test has run when the signal comes, while the launcher ends what torchrun left
    (in the launch) or scrubs the out folder (in the ending): the bundle is still scrubbed,
    written and verified, its receipt names the interruption (a passing run fails), and the
    run exits as an interrupted run does."""
    token = f"hf_late{uuid.uuid4().hex}"
    monkeypatch.setenv("HF_TOKEN", token)
    if moment == "scrub":
        monkeypatch.setattr(writer, "scrub_out_dir", signal_me_first(writer.scrub_out_dir, *sigs))
    else:
        monkeypatch.setattr(ending, "reap", signal_me_first(ending.reap, *sigs))
    out = tmp_path / "bundle"
    code, _ = run(out, 2, suite)
    err = capfd.readouterr().err
    sig = sigs[0]
    assert code == 128 + sig
    data = receipt(out)
    assert data["verdict"] == "fail"
    interrupted = data["run"]["extra"]["launch"]["interrupted"]
    assert interrupted is not None and interrupted["signal"] == sig.name, interrupted
    # torchrun had exited on its own, every test run, before the signal came
    assert 0 < interrupted["tests_done"] == interrupted["tests_collected"], interrupted
    assert data["root_cause"]["kind"] == "interrupted", data["root_cause"]
    assert any(f"interrupted by {sig.name}" in f for f in data["failures"]), data["failures"]
    assert main(["verify", str(out)]) == 0, "verify rejects the bundle finished under a signal"
    assert leaks(out, token) == []
    told = [line for line in err.splitlines() if "the bundle is being finished first" in line]
    assert len(told) == len(sigs), err


@main_thread_only
def test_a_signal_after_the_verdict_was_decided_leaves_the_bundle_as_written_and_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """^C while SHA256SUMS is written: the receipt (already on disk) keeps its pass, the bundle
    is finished and verifies, and the run still exits 130 and says why."""
    late = signal_me_first(
        writer.atomic_write_bytes, signal.SIGINT, when=lambda path, data: path.name == "SHA256SUMS"
    )
    monkeypatch.setattr(writer, "atomic_write_bytes", late)
    out = tmp_path / "bundle"
    code, _ = run(out, 2, "rank_pass.py")
    said = capsys.readouterr().out
    assert code == 130
    assert receipt(out)["verdict"] == "pass"
    assert main(["verify", str(out)]) == 0
    assert "interrupted by SIGINT after the verdict was decided" in said, said


@pytest.fixture(scope="module")
def strays_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, Path]:
    """One run of two suites whose tests pass but leave what is not evidence in the out folder:
    odd files (rank_strays.py) and a `logs` link to a folder outside (rank_link_logs.py).
    (exit code, out folder, the folder outside)."""
    base = tmp_path_factory.mktemp("strays")
    suites = ("rank_strays.py", "rank_link_logs.py")
    code, _, out, outside = run_with_folder(base, "DCPQUAL_OUTSIDE_DIR", suites)
    return code, out, outside


def test_odd_files_a_test_leaves_are_set_aside_named_and_the_run_fails(
    strays_run: tuple[int, Path, Path],
) -> None:
    code, out, _ = strays_run
    assert code == 1
    data = receipt(out)
    assert data["verdict"] == "fail"
    strays = {s["path"]: s for s in data["run"]["extra"]["strays"]}
    odd = {"link-to-hostname", "a-fifo", "receipt.json", "SHA256SUMS"}
    assert set(strays) == {*odd, "logs"}  # and the `logs` link, below
    assert strays["link-to-hostname"]["kind"] == "symlink"
    assert strays["a-fifo"]["kind"] == "fifo"
    assert strays["receipt.json"]["action"] == "moved to strays/receipt.json"
    assert json.loads((out / "strays" / "receipt.json").read_text())["verdict"] == "pass"
    assert "strays/receipt.json" in data["files"]  # kept, hashed, and not the receipt
    assert any("not evidence" in f for f in data["failures"]), data["failures"]
    assert data["suites"] and sum(t["failed"] for t in data["suites"].values()) == 0
    assert main(["verify", str(out)]) == 0


def test_a_logs_link_a_rank_left_takes_no_log_out_of_the_bundle(
    strays_run: tuple[int, Path, Path],
) -> None:
    """The ranks' logs are copied into the bundle's `logs/` after the ranks ran; a rank that
    made `logs` a link to a folder outside gets nothing written there, and the link is set
    aside as a stray."""
    code, out, outside = strays_run
    assert code == 1
    assert list(outside.iterdir()) == []
    data = receipt(out)
    logs = [s for s in data["run"]["extra"]["strays"] if s["path"] == "logs"]
    assert logs == [{"path": "logs", "kind": "symlink", "action": "removed"}]
    assert data["suites"] and sum(t["failed"] for t in data["suites"].values()) == 0
    assert {"logs/rank-00.stdout", "logs/rank-01.stdout"} <= set(data["files"])
    assert main(["verify", str(out)]) == 0


@pytest.fixture(scope="module")
def left_behind_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, float, Path, Path]:
    """One run of two suites whose passing tests leave what must neither change nor hold the
    run: files left open with bytes in their buffers (rank_left_open.py) and a thread left
    running (rank_thread_left.py). (exit code, seconds, out folder, the files' folder)."""
    base = tmp_path_factory.mktemp("left-behind")
    suites = ("rank_left_open.py", "rank_thread_left.py")
    return run_with_folder(base, "DCPQUAL_LEFT_OPEN_DIR", suites, "--timeout", "120")


def test_files_a_test_left_open_keep_their_buffered_bytes_as_a_cold_exit_keeps_them(
    left_behind_run: tuple[int, float, Path, Path],
) -> None:
    """Forked ranks, which multiprocessing ends with `os._exit`, still write what a cold
    interpreter's exit writes: the buffers of files the tests left open."""
    code, _, out, left = left_behind_run
    assert code == 0, receipt(out)["failures"]
    assert all(r.start is not None and r.start.forked for r in records(out).values())
    for rank in (0, 1):
        assert (left / f"collected-{rank}").read_text() == f"rank {rank}, opened at collection"
        assert (left / f"in-test-{rank}").read_text() == f"rank {rank}, opened in the test"


def test_a_full_disk_during_the_bundle_write_is_one_line_and_the_rank_files_are_scrubbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ENOSPC injected at the writer's I/O seam (`writer.atomic_write_bytes`) for receipt.json;
    the same ending on a real full tmpfs is `test_a_real_full_disk...` below, where root may
    mount one."""
    token = f"hf_full{uuid.uuid4().hex}"
    monkeypatch.setenv("HF_TOKEN", token)
    real_write = writer.atomic_write_bytes

    def full_disk(path: Path, data: bytes, **kw: Any) -> None:
        if path.name == "receipt.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_write(path, data, **kw)

    monkeypatch.setattr(writer, "atomic_write_bytes", full_disk)
    out = tmp_path / "bundle"
    code, _ = run(out, 2, "rank_secret.py")  # spills HF_TOKEN everywhere; rank 1 fails
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1, err
    assert "No space left on device" in err[0] and "not written: receipt.json" in err[0], err
    assert "written: none; not written: receipt.json, junit/merged.xml" in err[0]  # receipt first
    assert not (out / "receipt.json").exists()
    assert leaks(out, token) == [], "the scrub must come before the write that failed"


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def test_a_real_full_disk_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tmpfs that holds the ranks' files and not the bundle: a test fills it up to the last
    few KiB (rank_fill.py), so the bundle write meets a real ENOSPC."""
    mnt = tmp_path / "tiny"
    if not _mount_tmpfs(mnt, "4m"):
        pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)")
    try:
        out = mnt / "bundle"
        code, _ = run(out, 2, "rank_fill.py")
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1
        assert len(err) == 1 and "No space left on device" in err[0], err
        assert "not written:" in err[0]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_real_full_disk_leaves_no_secret_in_the_out_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """rank_fill.py leaves the token in a note and then no byte free, so the scrub that begins
    the ending meets a real ENOSPC: the note is scrubbed in place, and the one line says so."""
    mnt = tmp_path / "tiny"
    if not _mount_tmpfs(mnt, "4m"):
        pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)")
    token = f"hf_full{uuid.uuid4().hex}"
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("DCPQUAL_FILL_LEAVE_BYTES", "0")
    try:
        out = mnt / "bundle"
        code, _ = run(out, 2, "rank_fill.py")
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1
        assert "could not finish the bundle" in err[-1], err
        assert leaks(out, token) == []
        assert (out / "notes" / "rank-00.txt").read_text() == "HF_TOKEN=[REDACTED]\n"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _unusable_out(setup: str, tmp_path: Path) -> Path:
    """An --out the launcher cannot write into; skips where this machine cannot make one."""
    if setup == "parent-is-a-file":
        (tmp_path / "file").write_text("x")
        return tmp_path / "file" / "bundle"
    out = tmp_path / setup
    out.mkdir()
    if setup == "read-only":
        cmd = ["mount", "--bind", "-o", "ro", str(out), str(out)]
    else:  # immutable
        if shutil.which("chattr") is None:
            pytest.skip("no chattr here")
        cmd = ["chattr", "+i", str(out)]
    done = subprocess.run(cmd, capture_output=True, check=False)
    if done.returncode != 0 or (os.access(out / ".", os.W_OK) and _writable(out)):
        pytest.skip(f"cannot make a {setup} folder here: {done.stderr.decode().strip()}")
    return out


def _writable(path: Path) -> bool:
    try:
        (path / ".probe").write_text("x")
    except OSError:
        return False
    (path / ".probe").unlink()
    return True


def _undo(setup: str, out: Path) -> None:
    if setup == "read-only":
        subprocess.run(["umount", str(out)], capture_output=True, check=False)
    elif setup == "immutable":
        subprocess.run(["chattr", "-i", str(out)], capture_output=True, check=False)


@pytest.mark.parametrize("setup", ["read-only", "immutable", "parent-is-a-file"])
def test_an_unusable_out_folder_is_one_line_and_exit_2(
    setup: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _unusable_out(setup, tmp_path)
    try:
        code = main(["run", "--nproc-per-node", "2", "--tp", "2", "--out", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert "cannot use" in err[0] and str(out) in err[0], err
    finally:
        _undo(setup, out)


def test_an_absurd_world_size_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never"
    started = time.monotonic()
    code = main(["run", "--nproc-per-node", str(10**30), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "more ranks than this machine can hold" in err[0]
    assert time.monotonic() - started < 10 and not out.exists()


@pytest.mark.sixteen_ranks
def test_a_rank_exiting_0_mid_suite_is_noticed_within_seconds_and_blamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 16 ranks, rank 11 (a rank above 9, read from its record by the dead-rank watch):
    all that the same fault at 2 ranks would show, and that."""
    fault_rank = 11
    monkeypatch.setenv("DCPQUAL_FAULT_RANK", str(fault_rank))
    out = tmp_path / "bundle"
    code, elapsed = run(out, 16, "rank_exit0.py")  # default per-test timeout: 300 s
    assert code == 1
    data = receipt(out)
    assert data["run"]["extra"]["launch"]["ended_for_ranks_gone_mid_suite"] == [fault_rank]
    assert data["root_cause"]["rank"] == fault_rank, data["root_cause"]
    assert data["root_cause"]["test"].endswith("::test_fault")
    assert fault_rank in data["ranks"]["killed"] and fault_rank not in data["ranks"]["stopped"]
    assert main(["verify", str(out)]) == 0
    assert processes_of_run(out) == []
    # Ended by the dead-rank watch (ended_for above), not by the 300 s per-test timeout its
    # peers would otherwise wait out: well under half of it, however loaded the machine is.
    assert elapsed < 150, f"noticed after {elapsed:.0f}s"


def test_a_thread_a_test_left_running_does_not_hold_a_passing_run_to_its_timeout(
    left_behind_run: tuple[int, float, Path, Path],
) -> None:
    """Its records are final once pytest is done: a forkserver rank ends then, as the rank of a
    lone cold one does, instead of joining the thread before it returns to the agent."""
    code, elapsed, out, _ = left_behind_run
    assert code == 0, receipt(out)["failures"]
    assert not receipt(out)["run"]["extra"]["launch"]["timed_out"]
    assert elapsed < 90, f"ended after {elapsed:.0f}s"
    assert processes_of_run(out) == []


def test_a_child_that_ends_while_the_output_relays_finish_is_still_a_leftover(
    tmp_path: Path,
) -> None:
    """Uncaptured (`-s`), a test's child holds its rank's output relay open, and ends by itself
    1.5 s after torchrun, while the launcher lets the relays finish: it outlived torchrun all the
    same, one per rank."""
    out = tmp_path / "bundle"
    argv = ["run", "--nproc-per-node", "2", "--tp", "2", "--out", str(out)]
    code = main([*argv, "--", "-s", str(SUITES / "rank_short_child.py")])
    data = receipt(out)
    assert (code, data["verdict"]) == (1, "fail"), data["failures"]
    assert len(data["run"]["extra"]["launch"]["leftovers"]) == 2, data["run"]["extra"]["launch"]
    assert main(["verify", str(out)]) == 0


def test_double_forked_daemons_are_ended_and_fail_a_run_whose_tests_all_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the daemons did after their test passed, no test checked: the run fails naming them
    (and them alone: the ranks' output relays they held open are no leftovers of their own).
    Rank 1's daemon takes the relay's name and gets no relay's treatment: no rank's record
    names it, and it is a leftover like rank 0's.

    Not at 16 ranks: a daemon is found by the process tree, not by its rank, and no
    assertion here names a rank (the 16-rank faults whose root cause is a rank above 9 are
    `test_a_rank_exiting_0_mid_suite...` here and the SIGKILL in
    tests/test_reliability_faults.py)."""
    pids = tmp_path / "daemons"
    pids.mkdir()
    monkeypatch.setenv("DCPQUAL_DAEMON_NAME", RELAY_NAME)
    monkeypatch.setenv("DCPQUAL_DAEMON_PIDS", str(pids))
    out = tmp_path / "bundle"
    code, _ = run(out, 2, "rank_daemon.py")
    daemons = [int((pids / f"rank-{rank}").read_text()) for rank in (0, 1)]
    try:
        data = receipt(out)
        assert [identify(daemon) for daemon in daemons] == [None, None], "a daemon outlived it"
        assert sorted(data["run"]["extra"]["launch"]["leftovers"]) == sorted(daemons)
        assert processes_of_run(out) == []
        assert data["run"]["exit_code"] == 0
        assert sum(t["failed"] + t["errors"] for t in data["suites"].values()) == 0
        assert (code, data["verdict"]) == (1, "fail"), data["failures"]
        [reason] = data["failures"]
        assert "2 processes were still running after torchrun exited (pids " in reason, reason
        assert all(str(daemon) in reason for daemon in daemons), reason
        assert main(["verify", str(out)]) == 0
    finally:
        for daemon in daemons:
            if identify(daemon) is not None:
                os.kill(daemon, signal.SIGKILL)


def test_secrets_in_tool_print_forms_and_file_names_never_reach_the_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quoted = f"tok'en\\{uuid.uuid4().hex[:12]}\"x"  # repr escapes the quote and the backslash
    pat = f"ghp_{uuid.uuid4().hex}\n"  # a trailing newline: loggers print it stripped
    auth = f"npm_{uuid.uuid4().hex}"
    monkeypatch.setenv("DCPQUAL_TEST_TOKEN", quoted)
    monkeypatch.setenv("GITHUB_PAT", pat)
    monkeypatch.setenv("NPM_AUTH", auth)
    monkeypatch.setenv("MY_TOKEN", "complete")  # a word the receipt and records are made of
    out = tmp_path / "bundle"
    code, _ = run(out, 2, "rank_secret_forms.py")
    assert code == 1  # rank 1 fails, as planned
    data = receipt(out)
    assert data["ranks"]["complete"] == 2, data["ranks"]  # the records kept their structure
    assert leaks(out, quoted, pat, auth, repr(quoted)[1:-1]) == []
    assert any(p.startswith("notes/rank-1-[REDACTED]") for p in data["files"]), data["files"]
    assert "[REDACTED]" in data["root_cause"]["message"]
    assert main(["verify", str(out)]) == 0


def test_a_hang_during_collection_is_bounded_by_the_per_test_timeout_and_blames_that_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DCPQUAL_FAULT_RANK", "1")
    out = tmp_path / "bundle"
    code, elapsed = run(out, 2, "rank_collect_hang.py", "--test-timeout", "4", "--timeout", "300")
    assert code == 1
    assert elapsed < 60, f"ended after {elapsed:.0f}s: by the whole-run timeout?"
    data = receipt(out)
    assert data["run"]["timed_out"] is False
    cause = data["root_cause"]
    assert cause["rank"] == 1 and "hung during collection" in cause["message"], cause
    assert main(["verify", str(out)]) == 0
    assert processes_of_run(out) == []
