"""The process tree as the launcher reads it: identities by (pid, create time), zombies gone;
and the wait for torchrun's exit, with or without a pidfd."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.launch.proctree import ExitWait, Proc, alive, children_of, descendants, identify


def test_a_live_child_is_seen_with_its_identity() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = identify(child.pid)
        assert me is not None and alive(me)
        assert me in children_of(os.getpid())
        assert me in descendants(os.getpid())
        assert not alive(Proc(child.pid, me.create_time + 1))  # same pid, another process
    finally:
        child.kill()
        child.wait()
    assert identify(child.pid) is None and not alive(me)


def test_an_unreaped_child_counts_as_gone_and_keeps_its_exit_status() -> None:
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    deadline = time.monotonic() + 30
    while identify(child.pid) is not None:  # a zombie until reaped
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.05)
    assert os.path.exists(f"/proc/{child.pid}"), "still a zombie: nobody reaped it"
    assert child.wait(timeout=5) == 3  # reading the tree did not reap it


def test_a_pid_that_does_not_exist_has_no_identity_and_no_tree() -> None:
    pid = 2**22 + 12345  # above Linux's pid_max
    assert identify(pid) is None
    assert descendants(pid) == set() and children_of(pid) == set()


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "popen-wait"])
def test_exit_wait_returns_when_the_child_exits_with_its_status(
    pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    elif not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd on this platform")
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.readline(); raise SystemExit(5)"],
        stdin=subprocess.PIPE,
    )
    waiter = ExitWait(child)
    try:
        assert (waiter._fd is not None) == pidfd
        assert waiter.wait(0.2) is False and child.returncode is None
        assert child.stdin is not None
        child.stdin.close()  # the child reads EOF and exits
        started = time.monotonic()
        assert waiter.wait(30.0) is True
        assert time.monotonic() - started < 10, "the exit was not noticed when it happened"
        assert child.returncode == 5
    finally:
        waiter.close()
        child.kill()
        child.wait()
