"""How a launch ends, whatever ends it: containment, interruptions, and ranks that left early.

- Containment: torchrun starts in its own cgroup v2 directory where the machine allows one (a
  writable cgroup2 mount, e.g. as root); whatever a rank forks stays in it, and the launcher
  ends the cgroup's members after torchrun exits. Everywhere (and as the fallback) the launcher
  is also a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`) for the launch, so a process a rank
  double-forks into its own session re-parents to the launcher instead of to init, and the
  final scan finds it however briefly the run saw it.
- Interruptions: ^C or SIGTERM ends the tree and becomes a value, the schema's `Interruption`,
  that the evidence names; while the tree is being ended a second ^C does not abort the ending,
  it only skips the grace period (SIGKILL at once), so nothing is orphaned. From torchrun's exit
  until the bundle is written and verified, a signal is held (`Hold`): the bundle is finished
  first, and the signal is still the run's interruption.
- Early exits: a rank whose process is gone while its record says it is neither complete nor
  aborted left mid-suite (any exit code); its peers would wait for it until the per-test timeout.
  `DeadRankWatch` notices it within seconds so the launcher can end the tree.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from harness.launch.proctree import Proc, Tracker, alive, identify, named
from harness.launch.progress import Snapshot
from harness.launch.rankview import RankStatus, RecordReader
from harness.rank.outrelay import RELAY_NAME
from harness.schema.launch import Interruption, Launch

PR_SET_CHILD_SUBREAPER = 36
# How long a rank may be gone mid-suite before the launcher ends the tree: long enough for
# torchrun to act on a non-zero exit itself, short next to any per-test timeout.
DEAD_RANK_GRACE_S = 3.0


def set_subreaper(on: bool) -> bool:
    """Make this process a child subreaper (or stop being one); False where Linux says no."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def reap(procs: Iterable[Proc]) -> None:
    """Collect the exit status of adopted orphans that died, so none stays a zombie."""
    for proc in procs:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(proc.pid, os.WNOHANG)


def _cgroup2_mount() -> Path | None:
    """Where a cgroup v2 hierarchy is mounted (unified, or hybrid's /sys/fs/cgroup/unified)."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def _own_cgroup2() -> str | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        return None
    return None


def _remove_stale(parent: Path) -> None:
    """Empty cgroups of launchers that died without cleaning up (SIGKILL) are removed."""
    with contextlib.suppress(OSError):
        for stale in parent.glob("dcpqual-*-*"):
            pid = stale.name.split("-")[1]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                with contextlib.suppress(OSError):
                    stale.rmdir()  # refuses one that still has members


@dataclass(frozen=True)
class Cgroup:
    """A cgroup v2 directory the launch's torchrun starts in: every process below it stays in
    it whatever it forks, and `cgroup.kill` ends them all at once."""

    path: Path

    @classmethod
    def create(cls) -> Cgroup | None:
        """A new cgroup below this process's own, or None where the machine does not allow one."""
        mount, own = _cgroup2_mount(), _own_cgroup2()
        if mount is None or own is None:
            return None
        parent = mount / own.lstrip("/")
        _remove_stale(parent)
        path = parent / f"dcpqual-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir()
        except OSError:
            return None
        return cls(path)

    def join(self) -> None:  # pragma: no cover - runs in the forked child, before exec
        """Move the calling process into the cgroup (its children are born there)."""
        with contextlib.suppress(OSError):
            (self.path / "cgroup.procs").write_text("0")

    def pids(self) -> list[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return []
        return sorted(int(p) for p in text.split())

    def kill(self, wait_s: float = 5.0) -> None:
        """End every process in the cgroup (cgroup.kill, else SIGKILL each) and wait for it."""
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:
            for pid in self.pids():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + wait_s
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)

    def remove(self) -> None:
        """End anything still inside (it outlived torchrun), then remove the directory."""
        if self.pids():
            self.kill()
        deadline = time.monotonic() + 2.0
        while True:  # the kernel may still be releasing the last exited members
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)


class EnvironmentWitness:
    """A second witness to the run's processes besides its tree and cgroup: every process
    whose environment holds this node's rank plan exactly (the ranks are given it, and whatever
    they start inherits it), wherever it re-parented or whichever cgroup it moved itself to.
    Exactly: another run's plan (another out folder, another node of this run) is not ours."""

    def __init__(self, entry: str) -> None:
        """`entry`: the `NAME=value` environment entry that marks the run's processes."""
        self.entry = entry.encode()
        self.me = os.getpid()

    def find(self) -> set[Proc]:
        """Newest pids first: a helper that re-forks every few milliseconds is the newest
        process there, and is read before it has forked again and exited."""
        found: set[Proc] = set()
        for entry in sorted(_proc_entries(), key=lambda e: int(e.name), reverse=True):
            if int(entry.name) == self.me:
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:  # gone, or not ours to read
                continue
            if self.entry in environ.split(b"\0") and (proc := identify(int(entry.name))):
                found.add(proc)
        return found


def _proc_entries() -> list[Path]:
    try:
        return [e for e in Path("/proc").iterdir() if e.name.isdigit()]
    except OSError:
        return []


# How long a rank's output relay may take to write its rank's last lines after the rank ended
# (`harness.rank.outrelay`): milliseconds, unless something the rank started holds its pipes.
RELAY_FINISH_S = 2.0


def output_relays(processes: Iterable[Proc], relay_pids: Iterable[int]) -> list[Proc]:
    """The ranks' output relays among `processes`: a pid a rank's record names as its relay,
    whose process still bears the relay's name (a name alone is no proof: any process can take
    it, and no process a rank did not name gets a relay's treatment)."""
    pids = set(relay_pids)
    return [p for p in processes if p.pid in pids and named(p, RELAY_NAME)]


def let_relays_finish(relays: Iterable[Proc], timeout_s: float = RELAY_FINISH_S) -> None:
    """Wait (at most `timeout_s`) for `relays` to end by themselves: a relay writes its rank's
    last lines after the rank ended, and is no process the run left behind. One still alive
    then is held open by such a process (which inherited the rank's output), and ends once that
    process is ended."""
    relays = list(relays)
    deadline = time.monotonic() + timeout_s
    while relays and time.monotonic() < deadline:
        time.sleep(0.01)
        relays = [p for p in relays if alive(p)]


def process_group(pid: int) -> int | None:
    """The process group of `pid` (None: gone, unreadable, or no group of its own to end)."""
    try:
        group = os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None
    return group if group > 1 else None


def kill_with_group(pid: int, spare: set[int] | frozenset[int] = frozenset()) -> None:
    """SIGKILL `pid` and every member of its process group (unless the group is in `spare`):
    the kernel signals a group's members at once and restarts a fork that races the signal, so
    a helper that re-forks between a look and its kill leaves no child behind in its group,
    where a kill of one pid loses that race."""
    group = process_group(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    if group is not None and group not in spare:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


def sweep(
    tracker: Tracker,
    cgroup: Cgroup | None,
    witness: EnvironmentWitness | None = None,
    *,
    keep: set[int] | frozenset[int] = frozenset(),
    quiet_scans: int = 3,
    quiet_s: float = 0.5,
    limit_s: float = 10.0,
) -> set[Proc]:
    """SIGKILL whatever the tree, the cgroup and the witness still show, and look again,
    until `quiet_scans` looks in a row and at least `quiet_s` seconds find nothing (or
    `limit_s` passes): a helper that keeps re-forking (each parent exiting at once) outruns a
    single scan and kill, and on a loaded machine a few looks in a row can each read the /proc
    snapshot after the incarnation in it exited, where dozens of looks over half a second
    rarely all do.
    What is found is killed with its process group (`kill_with_group`), so the incarnation a
    look missed dies with the one it found; and the group of every process a look saw is read
    as the look returns and ended at each kill, since on a loaded machine the incarnation a
    look saw has often exited (with its child alive in its group) before it could be killed,
    and a look that saw a new process is never a quiet one. The launcher stays the subreaper
    its orphans re-parent to. The cgroup is killed at the end whatever was seen. Returns what it
    ended (pids in `keep`, and their groups and the launcher's own, are never signalled)."""
    ended: set[Proc] = set()
    groups: set[int] = set()  # of every process a look saw, read as soon as it was seen
    spare = {os.getpgrp(), *keep}
    quiet = 0
    deadline = time.monotonic() + limit_s
    last_found = time.monotonic()
    while (
        quiet < quiet_scans or time.monotonic() - last_found < quiet_s
    ) and time.monotonic() < deadline:
        before = set(tracker.seen)
        tracker.scan()
        if cgroup is not None:
            tracker.seen |= {p for pid in cgroup.pids() if (p := identify(pid)) is not None}
        if witness is not None:
            tracker.seen |= witness.find()
        new = {p for p in tracker.seen - before if p.pid not in keep}
        groups |= {g for p in new if (g := process_group(p.pid)) is not None} - spare
        live = [p for p in tracker.survivors() if p.pid not in keep]
        if not live and not new:
            quiet += 1
            time.sleep(0.01)
            continue
        quiet = 0
        last_found = time.monotonic()
        for found in live:
            kill_with_group(found.pid, spare=spare)
        for group in groups:  # an incarnation a look saw may be gone, its group not
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        ended.update(live)
        reap(live)
    if cgroup is not None:
        cgroup.kill(wait_s=2.0)
    return ended


def interruption(
    sig: int, after_s: float, seen: Snapshot | None = None, at: str | None = None
) -> Interruption:
    """The interruption by signal `sig`, `after_s` into the launch, with how far the tests had
    got (`seen`: what the records said when the signal came); `at`: when (default now)."""
    return Interruption(
        signal=signal.Signals(sig).name,
        at=datetime.now(UTC).isoformat(timespec="seconds") if at is None else at,
        after_s=round(after_s, 3),
        exit_code=128 + sig,
        tests_done=0 if seen is None else seen.done,
        tests_collected=0 if seen is None else seen.total,
        running=None if seen is None else seen.current,
    )


class _Handlers:
    """^C and SIGTERM go to `_on_signal` while inside (from the main thread, the only one that
    may set handlers); the previous handlers come back on the way out."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: object) -> None:
        raise NotImplementedError

    def _install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class Terminated(KeyboardInterrupt):
    """The launcher itself got SIGTERM (a cancelled CI job): end the tree like on ^C."""


def _tell_stderr(text: str) -> None:
    """A line from a signal handler, straight to fd 2: never through a buffered stream the
    interrupted code may be writing to at that moment (a reentrant write raises)."""
    with contextlib.suppress(OSError):
        os.write(2, (text + "\n").encode())


@dataclass(frozen=True)
class Held:
    """A signal the hold caught: which, when, and how long after the hold was entered."""

    signal: signal.Signals
    at: str
    after_s: float


def _raised_for(sig: signal.Signals) -> KeyboardInterrupt:
    """What a raised signal is in the launch: SIGTERM `Terminated`, ^C KeyboardInterrupt."""
    return Terminated() if sig == signal.SIGTERM else KeyboardInterrupt()


class Hold(_Handlers):
    """^C and SIGTERM for a whole `dcpqual run`. While torchrun runs they raise
    (KeyboardInterrupt, `Terminated`), so the launch ends the tree and names the interruption.
    From torchrun's exit (`start`) until the bundle is written and verified they are held:
    remembered and told on the console, never raised, so a late signal can neither abort the
    scrub nor leave a bundle without receipt or SHA256SUMS, and the first one is still the
    run's interruption (`named`), or its exit code when it came too late for the receipt.

    A handler's exception can be lost: Python runs a signal handler between any two bytecodes,
    also inside a gc callback, a `__del__` or a weakref callback, and drops what those raise
    ("Exception ignored in ..."). The launch's loop therefore asks `lost()` on every turn and
    raises a raised signal again itself."""

    def __init__(self, tell: Callable[[str], None] = _tell_stderr) -> None:
        """`tell`: how a held signal is told on the console (from the signal handler)."""
        super().__init__()
        self.tell = tell
        self.caught: list[Held] = []
        self.holding = False
        self.named = False  # the first caught signal is the interruption the receipt names
        self.raised = False  # one signal was raised: the launch is preparing its ending
        # The signal raised, until `lost` says (the signal, not its exception: that would keep
        # the frames of wherever it was raised alive until the hold ends).
        self._raised_by: signal.Signals | None = None
        self.hurry = threading.Event()  # a later signal meanwhile: end the tree at once
        self._t0 = time.monotonic()

    def __enter__(self) -> Hold:
        self._t0 = time.monotonic()
        self._install()
        return self

    def start(self) -> None:
        """torchrun has exited: from now on a signal is held, not raised."""
        self.holding = True

    def _on_signal(self, signum: int, frame: object) -> None:
        sig = signal.Signals(signum)
        if not self.holding and not self.raised:
            self.raised = True  # only once: every later signal is held, never raised
            self._raised_by = sig
            raise _raised_for(sig)
        if not self.holding:
            # Back to back with the raised one, while the launch ends its tree: raising again
            # would abort that ending (a helper left running, no bundle). It hurries it.
            self.hurry.set()
            self.tell(f"dcpqual run: {sig.name} again: ending the run's processes at once")
            return
        at = datetime.now(UTC).isoformat(timespec="seconds")
        self.caught.append(Held(sig, at, time.monotonic() - self._t0))
        again = " again" if len(self.caught) > 1 else ""
        self.tell(
            f"dcpqual run: {sig.name}{again}: the bundle is being finished first "
            "(scrubbed, written, verified); the run counts as interrupted"
        )

    def lost(self) -> KeyboardInterrupt | None:
        """The interruption raised where it could not reach the launch (called from the launch's
        loop, which a raised one would have left): to be raised again there, once."""
        raised, self._raised_by = self._raised_by, None
        return None if raised is None else _raised_for(raised)

    def interruption(self, seen: Snapshot | None = None) -> Interruption | None:
        """The first signal held, as an interruption (None: none was); `seen`: how far the
        tests had got."""
        if not self.caught:
            return None
        first = self.caught[0]
        return interruption(first.signal, first.after_s, seen, at=first.at)

    def name_in(self, result: Launch, seen: Snapshot | None = None) -> Launch:
        """`result` with the first signal held so far as its interruption, unless the launch
        was interrupted already (that signal came first)."""
        late = self.interruption(seen)
        if result.interrupted is not None or late is None:
            return result
        self.named = True
        return result.model_copy(update={"interrupted": late})


class DeadRankWatch:
    """Finds ranks that left mid-suite: process gone, record neither complete nor aborted.

    It reads the records through the launcher's shared `RecordReader`, so a tick costs a stat
    per rank while nothing changed. A record naming a process the tracker has not seen yet
    makes it walk the tree at once, so a rank is known from its first record on, whatever the
    launcher's scan cadence."""

    def __init__(self, reader: RecordReader, tracker: Tracker, node: int | None = None) -> None:
        """`node`: this launcher's node, whose ranks' pids are this host's: a forked rank can
        start, write its record and exit between two scans (its forkserver reaps it, not the
        launcher), so one of this node's records whose pid the tracker never saw and no process
        has now is gone too. None: every unseen pid is left unjudged."""
        self.reader = reader
        self.tracker = tracker
        self.node = node
        self.first_seen: dict[int, float] = {}
        self._looked_for: set[int] = set()

    def _records(self) -> dict[int, RankStatus]:
        return self.reader.statuses()

    def _look_for_new(self, records: dict[int, RankStatus]) -> None:
        """One scan when a running rank names a pid the tracker has not seen (nor looked for)."""
        seen = {p.pid for p in self.tracker.seen}
        new = {r.pid for r in records.values() if r.pid and not r.finished}
        new -= seen | self._looked_for
        if new:
            self._looked_for |= new
            self.tracker.scan()

    def _gone_mid_suite(self, rank: int, record: RankStatus) -> bool:
        if record.finished or not record.pid:
            return False
        known = [p for p in self.tracker.seen if p.pid == record.pid]
        if any(alive(p) for p in known):
            return False
        if not known and not self._gone_unseen(record):
            return False
        # The rank may have written its final record and exited after it was read: only a
        # record read from the file after the process was seen gone says how it left.
        final = self.reader.status(rank, fresh=True)
        return final is not None and not final.finished

    def _gone_unseen(self, record: RankStatus) -> bool:
        """One of this node's ranks that no scan saw, whose pid no process has now."""
        return (
            self.node is not None
            and record.extra.node_index == self.node
            and identify(record.pid) is None
        )

    def overdue(self, now: float | None = None) -> list[int]:
        """Ranks gone mid-suite for longer than DEAD_RANK_GRACE_S while their peers still wait.

        Once a peer has aborted, the ending is already under way (torchrun stopping the job
        after a non-zero exit, or the ranks' own watchdogs): nothing is overdue then."""
        now = time.monotonic() if now is None else now
        records = self._records()
        if any(r.abort_reason is not None for r in records.values()):
            return []
        self._look_for_new(records)
        for rank, record in records.items():
            if record.finished:
                self.first_seen.pop(rank, None)
            elif rank not in self.first_seen and self._gone_mid_suite(rank, record):
                self.first_seen[rank] = now
        return sorted(r for r, t in self.first_seen.items() if now - t >= DEAD_RANK_GRACE_S)
