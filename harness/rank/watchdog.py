"""The rank's watchdog thread: per-test timeout, peer failures, SIGTERM, orphaning, heartbeat.

Why a thread: the main thread may be blocked inside a gloo/NCCL call that no Python exception
or signal handler can interrupt. The watchdog can still dump every thread's stack, post a result
to the side channel, write the rank record and end the process, so one bad rank never holds the
others and never leaves an unexplained gap.

SIGTERM (torchrun stopping the job) reaches the watchdog through `signal.set_wakeup_fd`: the
interpreter's C-level handler writes the signal number to a pipe the watchdog selects on, even
while the main thread is stuck in C++. The agent's exit reaches it the same way, through a pidfd
of the agent (`harness.rank.parentage`: the parent, or for a rank the agent's forkserver forked,
the forkserver's parent); the parent pid is also compared at every wake-up (a forked rank's
parent is the forkserver, whose death orphans it too).

It sleeps until the next thing that can be due: the heartbeat, the running test's timeout, the
next look at its peers (every `tick_s` while a test runs, one store read of the alarm counter
unless a rank failed or left), the end of a peer failure's grace. Sixteen ranks on a few cores
pay every wake-up and every store round trip; a rank idle between tests wakes once a heartbeat.

Exactly one thread decides a test's fate: the main thread by `body_done()`, or the watchdog by
claiming the test first; whichever loses that race steps aside.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Literal

from harness.pidfd import pidfd_open
from harness.rank.agreement import Agreement, LocalResult, agree
from harness.rank.bootstrap import collective_sequence_numbers
from harness.rank.parentage import parentage
from harness.rank.rankfiles import RecordKeeper, dump_stacks, write_error_file
from harness.rank.sidechannel import SideChannel
from harness.schema.plan import ABORT_GRACE_S, RUN_TIMEOUT_S, TEST_TIMEOUT_S

Phase = Literal["idle", "body", "agree", "finishing", "claimed"]
EXIT_FAILED = 1
EXIT_TERMINATED = 128 + signal.SIGTERM
_DIST_DIR = f"{os.sep}torch{os.sep}distributed{os.sep}"
_RUNPY = runpy._run_code.__code__.co_filename  # type: ignore[attr-defined]  # "<frozen runpy>"


@dataclass(frozen=True)
class WatchConfig:
    """Timing of the watchdog. `test_timeout_s <= 0` disables the per-test timeout; the two
    the rank plan carries default to its defaults."""

    test_timeout_s: float = TEST_TIMEOUT_S
    # A peer failed: how long this rank may still finish the test.
    abort_grace_s: float = ABORT_GRACE_S
    exchange_grace_s: float = 5.0  # after a timeout: how long to wait for peers' reports
    heartbeat_s: float = 1.0  # the record's mtime, and what its keeper noted, at this pace
    tick_s: float = 0.5  # while a test runs: how often to look for a peer's failure
    # After SIGTERM during agreement: how long the main thread may still take to record the
    # test (its peers' wait is cut to 2 s by the abort). Well inside torchrun's shutdown timeout.
    agree_wait_s: float = 3.0


def main_thread_in_collective() -> bool:
    """Is the main thread inside a torch.distributed call right now (waiting for peers)?"""
    return in_collective(sys._current_frames().get(threading.main_thread().ident or -1))


def in_collective(frame: FrameType | None) -> bool:
    """Is a torch.distributed frame on the stack ending in `frame`, above the rank's `-m` entry?

    Below that entry is what started the interpreter's module: nothing for a cold rank, and
    torchelastic's own worker wrapper (`torch/distributed/elastic/...`) for one its agent started
    as a function, which is no call the rank is blocked in."""
    while frame is not None and frame.f_code.co_filename != _RUNPY:
        if _DIST_DIR in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


class Watchdog:
    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        channel: SideChannel,
        keeper: RecordKeeper,
        out_dir: Path,
        config: WatchConfig,
        wakeup_fd: int | None = None,
        exit_fn: Callable[[int], None] = os._exit,
        agent_pid: int | None = None,
    ) -> None:
        """`agent_pid`: the process whose exit orphans this rank (default: its parent, the
        torchrun agent)."""
        self.rank = rank
        self.world_size = world_size
        self.channel = channel
        self.keeper = keeper
        self.out_dir = out_dir
        self.config = config
        self.wakeup_fd = wakeup_fd
        self.exit_fn = exit_fn
        self._lock = threading.Lock()
        self._phase: Phase = "idle"
        self._index = -1
        self._nodeid = ""
        self._ranks: tuple[int, ...] | None = None  # the lane running a sub-world case
        self._test_started = 0.0
        self._peer_failure_seen: float | None = None
        self._alarms_seen = 0  # the side channel's alarm counter at the last look
        self._peer_left = False  # a peer left the job (the abort key is set; it stays set)
        self._stopping = threading.Event()
        self._finished = threading.Event()
        self._ppid = os.getppid()  # the agent, or the forkserver that forked this rank
        self._forked = parentage().forked
        self._parent_fd = pidfd_open(parentage().agent if agent_pid is None else agent_pid)
        self._kick_r, self._kick_w = os.pipe()  # `stop` wakes the thread at once
        os.set_blocking(self._kick_r, False)
        os.set_blocking(self._kick_w, False)
        self._thread = threading.Thread(target=self._run, name="dcpqual-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # -- called from the main thread ------------------------------------------------------

    def begin_test(self, index: int, nodeid: str, ranks: tuple[int, ...] | None = None) -> None:
        """`ranks`: the lane that runs this sub-world case (None: every rank)."""
        with self._lock:
            self._phase, self._index, self._nodeid = "body", index, nodeid
            self._ranks = ranks
            self._test_started = time.monotonic()
            self._peer_failure_seen = None

    def body_done(self) -> bool:
        """The test finished on this rank. False: the watchdog already took it over."""
        with self._lock:
            if self._phase == "claimed":
                return False
            self._phase = "agree"
            return True

    def idle(self) -> None:
        with self._lock:
            if self._phase != "claimed":
                self._phase = "idle"

    def session_finishing(self) -> None:
        with self._lock:
            if self._phase != "claimed":
                self._phase = "finishing"

    def session_finished(self) -> None:
        self._finished.set()

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            os.write(self._kick_w, b"x")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        if not self._thread.is_alive():
            self._close_fds()

    def _close_fds(self) -> None:
        fds, self._parent_fd = (self._kick_r, self._kick_w, self._parent_fd), None
        self._kick_r = self._kick_w = -1
        for fd in fds:
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def test_deadline(self) -> float:
        """Monotonic time by which every live peer has finished or timed out this test (with no
        per-test timeout, within the whole run's default time limit)."""
        timeout = self.config.test_timeout_s if self.config.test_timeout_s > 0 else RUN_TIMEOUT_S
        return self._test_started + timeout + self.config.exchange_grace_s + 10.0

    def park(self) -> None:
        """The main thread lost the race: wait here until the watchdog ends the process."""
        while True:
            time.sleep(1.0)

    # -- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        last_beat = 0.0
        next_look = 0.0  # the next look at the peers while a test runs
        while not self._stopping.is_set():
            woke = self._sleep(self._next_wake(last_beat, next_look))
            if self._stopping.is_set():
                return
            if woke == "sigterm":
                self._terminate("received SIGTERM (torchrun stopped the job or it was cancelled)")
                return
            now = time.monotonic()
            if now - last_beat >= self.config.heartbeat_s:
                self.keeper.heartbeat()
                last_beat = now
            if woke == "orphaned" or os.getppid() != self._ppid:
                self._terminate(self._orphaned_by(woke == "orphaned"))
                return
            with self._lock:
                phase, index, nodeid, started = (
                    self._phase,
                    self._index,
                    self._nodeid,
                    self._test_started,
                )
            if phase != "body":
                continue
            timeout = self.config.test_timeout_s
            if timeout > 0 and now - started > timeout and self._claim(index):
                self._on_timeout(index, nodeid, now - started)
                return
            if self._peer_failure_seen is None and now < next_look:
                continue
            next_look = now + self.config.tick_s
            if self._peer_failed(index, now) and self._claim(index):
                self._on_peer_failure(index, nodeid)
                return

    def _next_wake(self, last_beat: float, next_look: float) -> float:
        """Seconds until the next thing that can be due (see the module doc)."""
        now = time.monotonic()
        wake = last_beat + self.config.heartbeat_s
        if self._parent_fd is None:  # no pidfd: the parent pid is compared at each wake-up
            wake = min(wake, now + self.config.tick_s)
        with self._lock:
            phase, started, seen = self._phase, self._test_started, self._peer_failure_seen
        if phase == "body":
            if self.config.test_timeout_s > 0:
                wake = min(wake, started + self.config.test_timeout_s)
            wake = min(wake, next_look if seen is None else seen + self.config.abort_grace_s)
        return max(0.0, wake - now)

    def _orphaned_by(self, agent_gone: bool) -> str:
        if self._forked and not agent_gone:
            return "orphaned: the forkserver that forked this rank is gone"
        return "orphaned: the torchrun agent that started this rank is gone"

    def _sleep(self, timeout: float) -> Literal["sigterm", "orphaned"] | None:
        """Wait up to `timeout`; say whether SIGTERM arrived or the parent exited."""
        fds = [fd for fd in (self._kick_r, self.wakeup_fd, self._parent_fd) if fd is not None]
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except (OSError, ValueError):  # an fd is being closed at the end
            self._stopping.wait(timeout)
            return None
        if self._kick_r in ready:
            with contextlib.suppress(OSError):
                os.read(self._kick_r, 64)
        if self.wakeup_fd is not None and self.wakeup_fd in ready:
            try:
                data = os.read(self.wakeup_fd, 64)
            except OSError:  # nothing to read, or the pipe is being closed at the end
                data = b""
            if signal.SIGTERM in data:
                return "sigterm"
        if self._parent_fd is not None and self._parent_fd in ready:
            return "orphaned"
        return None

    def _claim(self, index: int) -> bool:
        with self._lock:
            if self._phase != "body" or self._index != index:
                return False
            self._phase = "claimed"
            return True

    def _peer_failed(self, index: int, now: float) -> bool:
        """A peer failed this test, or (outside a lane) left the job. A lane running a
        sub-world case is not stopped by another lane's trouble: that would make its own
        case fail first, at an earlier test, and take the blame."""
        if self._peer_failure_seen is None:
            alarms = self.channel.alarms()  # the one read while nothing happened anywhere
            if alarms != self._alarms_seen or self.channel.lost:
                self._alarms_seen = alarms
                self._peer_left = self._peer_left or self.channel.aborted()
                if self.channel.failures_in(index):
                    self._peer_failure_seen = now
            if self._ranks is None and self._peer_left:
                self._peer_failure_seen = now
            return False
        return now - self._peer_failure_seen >= self.config.abort_grace_s

    def _probe(self) -> tuple[bool, dict[str, int]]:
        return main_thread_in_collective(), collective_sequence_numbers()

    def _aborted(self, message: str) -> LocalResult:
        """This rank's result for a test it is leaving because of something outside it (a peer's
        failure, SIGTERM): an error, never primary, with where the main thread was."""
        in_collective, seqs = self._probe()
        return LocalResult(
            rank=self.rank,
            outcome="error",
            kind="aborted",
            message=message,
            failed_at=time.time(),
            in_collective=in_collective,
            seqs=seqs,
        )

    # -- endings --------------------------------------------------------------------------

    def _settle(self, index: int, nodeid: str, mine: LocalResult, wait_s: float) -> Agreement:
        self.channel.post_result(index, mine)
        results = self.channel.gather_results(index, time.monotonic() + wait_s, self._ranks)
        results[self.rank] = mine
        return agree(nodeid, results, self.world_size, self._ranks)

    def _on_timeout(self, index: int, nodeid: str, elapsed: float) -> None:
        stacks = dump_stacks(self.out_dir, self.rank, f"per-test timeout in {nodeid}")
        in_collective, seqs = self._probe()
        where = (
            "blocked inside a torch.distributed call"
            if in_collective
            else "not inside a torch.distributed call"
        )
        mine = LocalResult(
            rank=self.rank,
            outcome="failed",
            kind="timeout",
            message=f"timed out after {elapsed:.0f}s, {where} (stacks: {stacks.name})",
            duration_s=elapsed,
            failed_at=time.time(),
            fail_seq=self.channel.next_fail_seq(index),
            in_collective=in_collective,
            seqs=seqs,
        )
        agreement = self._settle(index, nodeid, mine, self.config.exchange_grace_s)
        outcome = agreement.outcome_for(mine)
        if outcome.primary:
            write_error_file(self.rank, nodeid, mine.message or "", stacks.read_text())
        self.keeper.abort(f"per-test timeout in {nodeid}", primary=outcome.primary, test=outcome)
        self.channel.signal_abort(f"rank {self.rank} timed out in {nodeid}")
        self.exit_fn(EXIT_FAILED)

    def _on_peer_failure(self, index: int, nodeid: str) -> None:
        dump_stacks(self.out_dir, self.rank, f"aborting {nodeid} after a peer failed")
        peers = self.channel.peer_results(index).items()
        failed = sorted(r for r, res in peers if res.failing and res.kind != "aborted")
        info = self.channel.abort_info()
        if failed:
            who = f"rank(s) {', '.join(map(str, failed))} failed it"
        elif info:
            who = f"rank {info.rank} left the job ({info.reason})"
        else:
            who = "a peer failed"
        mine = self._aborted(
            f"aborted: still in the test {self.config.abort_grace_s:g}s after {who}"
        )
        agreement = self._settle(index, nodeid, mine, 2.0)
        outcome = agreement.outcome_for(mine)
        self.keeper.abort(f"aborted {nodeid}: {who}", primary=False, test=outcome)
        self.channel.signal_abort(f"rank {self.rank} aborted {nodeid} after {who}")
        self.exit_fn(EXIT_FAILED)

    def _phase_after_agreement(self, reason: str) -> tuple[Phase, int, str]:
        """The phase to end in; a test in its body is claimed. A rank stopped while agreeing on
        a test's outcome (its own failure may be the run's root cause) first tells its peers,
        which cuts the main thread's wait for them short, and gives it up to `agree_wait_s` to
        record that outcome; otherwise the record is sealed without the one message that
        explains the run."""
        deadline = time.monotonic() + self.config.agree_wait_s
        told = False
        while True:
            with self._lock:
                phase, index, nodeid = self._phase, self._index, self._nodeid
                if phase == "body":
                    self._phase = "claimed"
            if phase != "agree" or time.monotonic() >= deadline:
                return phase, index, nodeid
            if not told:
                self.channel.signal_abort(f"rank {self.rank}: {reason}")
                told = True
            time.sleep(0.01)

    def _terminate(self, reason: str) -> None:
        self.keeper.stopping(reason)  # a session that still finishes says it was stopped
        phase, index, nodeid = self._phase_after_agreement(reason)
        if phase == "finishing":
            self._finished.wait(5.0)  # let pytest finish writing junit and the record
        if self._finished.is_set():
            self.exit_fn(EXIT_TERMINATED)
            return
        dump_stacks(self.out_dir, self.rank, reason)
        test = None
        if phase == "body":
            mine = self._aborted(f"{reason}, while running this test")
            self.channel.post_result(index, mine)
            test = Agreement(nodeid, "error", (), mine.message, complete=False).outcome_for(mine)
        self.channel.signal_abort(f"rank {self.rank}: {reason}")
        self.keeper.abort(reason, primary=False, test=test)
        self.exit_fn(EXIT_TERMINATED)
