"""The launcher's side of the rank zygote: start it before torchrun, watch it while the run
lasts, end it after the ranks, and say how it went (`ZygoteState`).

The zygote starts as torchrun does (its own session, the launcher's death signal, the run's
cgroup), and the launch's `Tracker` follows its children as ranks. torchrun starts right after
it, without waiting: the stubs wait for its socket while torchrun imports and rendezvouses, so
the two imports overlap. A zygote that cannot start or exits before torchrun is the launch's
failure, named in one line; one that refuses to fork (a thread alive after its preload, e.g. a
BLAS pool a user's OMP_NUM_THREADS > 1 started) is not: its stubs start their ranks cold, and
the state says the zygote was not used and why.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.launch.plan import ZygotePlan, remove_stale_private_dirs
from harness.launch.proctree import end_launch_root, start_launch_root
from harness.rank.forkwire import ZYGOTE_PID_ENV, clear_stale, read_refusal
from harness.rank.zygote import EXIT_REFUSED
from harness.rank.zygotelog import Event, Forked, Ready, Reaped, SentCold, read_events
from harness.schema.launch import HashSeedMode, ZygoteState

STOP_GRACE_S = 5.0


@dataclass
class ZygoteRun:
    """A started zygote (`proc`), or one that could not start (`error`)."""

    plan: ZygotePlan
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    pythonhashseed: str = "random"  # what the zygote (and so every forked rank) was started with
    refused: str | None = None  # its refusal to fork, once read

    @classmethod
    def start(
        cls,
        plan: ZygotePlan,
        log: Path,
        env: dict[str, str],
        preexec: Callable[[], None] | None,
    ) -> ZygoteRun:
        run = cls(plan, log, pythonhashseed=env.get("PYTHONHASHSEED", "random"))
        if plan.private_dir is not None:
            remove_stale_private_dirs(plan.private_dir.parent)
            try:  # this run's own: it fails where anything is at the path already
                os.mkdir(plan.private_dir, 0o700)
            except OSError as exc:
                run.error = f"the rank zygote's socket folder could not be made: {exc}"
                return run
        # What an earlier zygote at this path left (a launcher killed before its `stop`) would
        # send the stubs cold while this one preloads, and name its reason.
        clear_stale(str(plan.socket))
        try:
            with log.open("wb") as out:
                run.proc = start_launch_root(
                    lambda: subprocess.Popen(
                        plan.argv,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=preexec,
                    )
                )
        except OSError as exc:
            run.error = f"the rank zygote could not start ({' '.join(plan.argv)}): {exc}"
            if plan.private_dir is not None:
                with contextlib.suppress(OSError):
                    os.rmdir(plan.private_dir)
        return run

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def stub_env(self) -> dict[str, str]:
        """What the stubs need besides the plan's environment: the zygote's pid."""
        return {} if self.proc is None else {ZYGOTE_PID_ENV: str(self.proc.pid)}

    def died(self) -> str | None:
        """The one-line error once the zygote has exited while it was still needed."""
        if self.error is not None or self.proc is None:
            return self.error
        code = self.proc.poll()
        if code is None or (code == EXIT_REFUSED and self.refusal() is not None):
            return None
        self.error = (
            f"the rank zygote (pid {self.proc.pid}) exited with {code} after "
            f"{time.monotonic() - self.started:.1f}s, before torchrun did: {self._last_line()}"
            f" (log: {self.log})"
        )
        return self.error

    def _last_line(self) -> str:
        with contextlib.suppress(OSError):
            lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
            if lines:
                return lines[-1].strip()
        return "it logged nothing"

    def refusal(self) -> str | None:
        """Why the zygote refused to fork any rank (its note beside the socket), if it did."""
        if self.refused is None and self.proc is not None:
            with contextlib.suppress(OSError):
                note = read_refusal(str(self.plan.socket))
                if note is not None and note.pid == self.proc.pid:
                    self.refused = note.reason
        return self.refused

    def events(self) -> list[Event]:
        """What the zygote has logged so far."""
        with contextlib.suppress(OSError):
            return read_events(self.log.read_bytes())
        return []

    def reaped(self) -> set[tuple[int, int]]:
        """(rank, pid) of each rank the zygote has forked and reaped, from its log read to its
        end (a pid forked again after its reaping is not in it)."""
        rank_of: dict[int, int] = {}
        gone: set[tuple[int, int]] = set()
        for event in self.events():
            if isinstance(event, Forked) and event.rank is not None:
                rank_of[event.pid] = event.rank
                gone = {(r, p) for r, p in gone if p != event.pid}
            elif isinstance(event, Reaped) and event.pid in rank_of:
                gone.add((rank_of[event.pid], event.pid))
        return gone

    def hash_seed(self, used: bool) -> HashSeedMode:
        """What the ranks' string-hash seeds were, from the PYTHONHASHSEED the ranks got."""
        if self.pythonhashseed not in ("", "random"):
            return "fixed"
        return "shared-random" if used else "per-rank-random"

    def stop(self) -> None:
        """End the zygote (its ranks are gone by now; any left are the launch's strays)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        end_launch_root(self.proc.pid)
        self.refusal()  # read before the note goes
        clear_stale(str(self.plan.socket))
        if self.plan.private_dir is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.plan.private_dir)

    def state(self) -> ZygoteState:
        events = self.events()
        forked = sum(isinstance(e, Forked) for e in events)
        cold = [e.reason for e in events if isinstance(e, SentCold)]
        refusal = self.refusal()
        not_used = None
        if not forked:
            not_used = refusal or self.error or (cold[0] if cold else "no rank asked it for a fork")
        return ZygoteState(
            pid=self.pid or 0,
            ready=any(isinstance(e, Ready) for e in events),
            exit_code=None if self.proc is None else self.proc.returncode,
            error=self.error,
            used=forked > 0,
            forked=forked,
            not_used=not_used,
            sent_cold=len(cold),
            sent_cold_why=cold[0] if cold else None,
            hash_seed=self.hash_seed(forked > 0),
        )
