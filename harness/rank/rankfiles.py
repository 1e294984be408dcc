"""What a rank leaves in the out folder: its record, its stack dumps, torchrun's error file.

Written from two threads (pytest's main thread and the watchdog), so every write goes through
one lock, and the record is replaced atomically: a rank killed at any moment leaves either the
previous record or the next one, never half of one.

The record is rewritten for every change that is evidence (a test's outcome, a capture, the
end), hundreds of times per rank, and grows to about 100 KB: it is written as compact JSON, and
what only grows (collected ids, tests, captures, all frozen values) is serialized once per item.
What only the launcher's live progress reads (which test runs, since when this rank waits for its
peers) is noted in memory and reaches the disk with the next write or the watchdog's heartbeat,
at most a heartbeat late: the file write, a rename over the last record, costs milliseconds of
I/O with 16 ranks writing at once, and those notes were two of every test's three writes. The
evidence never needs them: the test a dead rank was in is the first it collected and did not
report (`harness.evidence.collect.in_progress`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import faulthandler
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.atomic import atomic_write_text
from harness.core.secrets import Scrubber, environment_scrubber
from harness.gitinfo import checkout_identity
from harness.rank.parentage import parentage
from harness.schema.capture import CaptureRecord
from harness.schema.image import IDENTITY_ENV
from harness.schema.plan import RankPlan
from harness.schema.rank_record import (
    HASH_PROBE,
    ErrorNote,
    Provenance,
    RankRecord,
    RankStart,
    TestOutcome,
    error_file_note,
    rank_record_path,
    stacks_path,
)
from harness.schema.rank_record import junit_path as junit_path  # re-exported for the plugin


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class RecordText:
    """A rank record's compact JSON (`RankRecord.to_json`), serializing each collected id, test
    and capture once: those sequences only grow, item by item, so a record that extends the
    last one reuses the text of every item it shares with it (by identity).

    Scrubbed as it is serialized, as the ending's scrub would scrub the file (as JSON values,
    with this process's secrets): a test id or a failure message that holds a secret never
    reaches the disk raw, even where the launcher is killed before its ending."""

    GROWING = ("collected", "tests", "captures")

    def __init__(self, scrubber: Scrubber | None = None) -> None:
        self._cache: dict[str, tuple[Sequence[Any], list[str]]] = {}
        self._scrubber = environment_scrubber() if scrubber is None else scrubber

    def _dump(self, value: Any) -> str:
        return _compact(self._scrubber.value(value)[0])

    def _items(self, key: str, items: Sequence[Any], dump: Callable[[Any], str]) -> str:
        seen, texts = self._cache.get(key, ((), []))
        if items is not seen:
            shared = len(seen) <= len(items) and all(
                a is b for a, b in zip(seen, items, strict=False)
            )
            start = len(seen) if shared else 0
            texts = (texts if shared else []) + [dump(item) for item in items[start:]]
            self._cache[key] = (items, texts)
        return "[" + ",".join(texts) + "]"

    def text(self, record: RankRecord) -> str:
        head = replace(record, collected=(), tests=(), captures=()).to_json()
        for key in self.GROWING:
            del head[key]
        parts = (
            ("collected", self._items("collected", record.collected, self._dump)),
            ("tests", self._items("tests", record.tests, lambda t: self._dump(t.to_json()))),
            (
                "captures",
                self._items("captures", record.captures, lambda c: self._dump(c.to_json())),
            ),
        )
        tail = "".join(f',"{key}":{text}' for key, text in parts)
        return self._dump(head)[:-1] + tail + "}\n"


def rank_provenance(rank: int) -> Provenance:
    """The image this rank's environment names and, on rank 0, the harness checkout it runs."""
    digest = None
    raw = os.environ.get(IDENTITY_ENV)
    if raw:
        try:
            named = json.loads(raw)
        except ValueError:
            named = None
        found = named.get("digest") if isinstance(named, dict) else None
        digest = found if isinstance(found, str) else None
    return Provenance.of(digest, checkout_identity() if rank == 0 else None)


def rank_start(output_relay: int | None = None, plan: RankPlan | None = None) -> RankStart:
    """What this rank knows of its own start: forked or not, its string-hash seed (drawn or not,
    as its `plan` says; None: started without one), and the relay that writes its output (its
    pid, where one was started)."""
    seed = os.environ.get("PYTHONHASHSEED", "")
    return RankStart(
        forked=parentage().forked,
        hash_probe=hash(HASH_PROBE),
        hash_seed_fixed=seed.isdigit(),
        output_relay=output_relay,
        hash_seed=int(seed) if seed.isdigit() else None,
        hash_seed_drawn=None if plan is None else plan.hash_seed_was_drawn,
    )


class RecordKeeper:
    """Owns this rank's `RankRecord`; every change is written to disk at once."""

    def __init__(self, path: Path, record: RankRecord) -> None:
        self.path = path
        self._record = record
        self._lock = threading.Lock()
        self._sealed = False  # after a final write by the watchdog, main-thread writes stop
        self._stop_reason: str | None = None  # set by `stopping`, used by `finish`
        self._text = RecordText()
        self._unwritten = False  # noted changes the file does not hold yet
        self._write(record)

    @classmethod
    def start(
        cls,
        records_dir: Path,
        *,
        rank: int,
        world_size: int,
        local_rank: int,
        node_rank: int,
        backend: str,
        device: str,
        warm_impl: str,
        output_relay: int | None = None,
        plan: RankPlan | None = None,
    ) -> RecordKeeper:
        record = RankRecord(
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            node_rank=node_rank,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            backend=backend,
            device=device,
            warm_impl=warm_impl,
            started_at=utc_now(),
            start=rank_start(output_relay, plan),
            provenance=rank_provenance(rank),
        )
        return cls(rank_record_path(records_dir, rank), record)

    @property
    def record(self) -> RankRecord:
        return self._record

    def _write(self, record: RankRecord) -> None:
        self._record = record
        atomic_write_text(self.path, self._text.text(record), fsync=False)
        self._unwritten = False

    def update(self, **changes: Any) -> None:
        """Rewrite the record with these fields changed (`dataclasses.replace` checks names)."""
        with self._lock:
            if not self._sealed:
                self._write(replace(self._record, **changes))

    def note(self, **changes: Any) -> None:
        """Change the record in memory only: the file gets it with the next write or heartbeat.
        For what no evidence depends on, or what a write right after carries."""
        with self._lock:
            if not self._sealed:
                self._record = replace(self._record, **changes)
                self._unwritten = True

    def collected(self, nodeids: tuple[str, ...]) -> None:
        self.update(collected=nodeids)

    def running(self, nodeid: str | None) -> None:
        """The test that runs now (noted: for the live progress)."""
        self.note(current_test=nodeid, waiting_since=None)

    def waiting(self) -> None:
        """The test's body is done here; the rank now waits for its peers' results (noted)."""
        self.note(waiting_since=time.time())

    def add_test(self, outcome: TestOutcome) -> None:
        with self._lock:
            if not self._sealed:
                record = self._record.with_test(outcome)
                self._write(replace(record, current_test=None, waiting_since=None))

    def add_capture(self, capture: CaptureRecord) -> None:
        with self._lock:
            if not self._sealed:
                self._write(self._record.with_capture(capture))

    def abort(self, reason: str, *, primary: bool, test: TestOutcome | None = None) -> None:
        """Final words of a rank that leaves abnormally; later writes are ignored."""
        with self._lock:
            if self._sealed:
                return
            record = self._record
            if test is not None and not any(t.nodeid == test.nodeid for t in record.tests):
                record = record.with_test(test)
            self._write(
                replace(
                    record,
                    abort_reason=reason,
                    abort_primary=primary,
                    aborted_at=time.time(),
                    finished_at=utc_now(),
                )
            )
            self._sealed = True

    def stopping(self, reason: str) -> None:
        """Told to stop (SIGTERM, orphaned): noted at once, so if the session still gets to
        `finish`, the complete record says why, and a stopped rank never reads as one that
        ended on its own."""
        with self._lock:
            self._stop_reason = reason

    @property
    def stop_reason(self) -> str | None:
        with self._lock:
            return self._stop_reason

    def finish(self, *, abort_reason: str | None = None, primary: bool = False) -> None:
        """The session ended on its own: the record is complete."""
        with self._lock:
            if self._sealed:
                return
            if abort_reason is None and self._stop_reason is not None:
                abort_reason, primary = self._stop_reason, False
            changes: dict[str, Any] = {
                "complete": True,
                "finished_at": utc_now(),
                "current_test": None,
            }
            if abort_reason is not None and self._record.abort_reason is None:
                changes.update(abort_reason=abort_reason, abort_primary=primary)
                changes["aborted_at"] = time.time()
            self._write(replace(self._record, **changes))
            self._sealed = True

    def heartbeat(self) -> None:
        """Write what was noted, else touch the record: its mtime is this rank's last sign of
        life for the launcher. Called from the watchdog's thread, so it never raises OSError."""
        with self._lock, contextlib.suppress(OSError):
            if self._unwritten and not self._sealed:
                self._write(self._record)
            else:
                os.utime(self.path)


def dump_stacks(out_dir: Path, rank: int, reason: str) -> Path:
    """Append every thread's Python stack to stacks/rank-NN.txt (faulthandler: no GIL games)."""
    path = stacks_path(out_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(f"=== rank {rank} pid {os.getpid()} at {utc_now()}: {reason}\n")
        fh.flush()
        faulthandler.dump_traceback(file=fh, all_threads=True)
        fh.write("\n")
    return path


def write_error_file(rank: int, test: str | None, message: str, callstack: str = "") -> None:
    """Write torchrun's per-worker error file (TORCHELASTIC_ERROR_FILE), as `@record` would.

    torchrun copies the earliest one into its own error file and prints it as the root cause,
    so a failure is attributed even by someone reading only torchrun's output. Scrubbed as it
    is written, as the record is.
    """
    target = os.environ.get("TORCHELASTIC_ERROR_FILE")
    # The first failure's note is kept; a file a child of this rank left (it inherited the
    # variable) is not this rank's and is replaced.
    if not target or error_file_note(Path(target)) is not None:
        return
    where = f" in {test}" if test else ""
    data = {
        "message": {
            "message": f"rank {rank}{where}: {message}",
            "extraInfo": {
                "py_callstack": callstack or message,
                "timestamp": str(int(time.time())),
                "dcpqual": ErrorNote(rank, test, message, time.time()).to_json(),
            },
        }
    }
    try:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps(environment_scrubber().value(data)[0]))
    except OSError:
        pass
