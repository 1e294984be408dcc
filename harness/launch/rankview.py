"""The launcher's live view of the rank records (`records/rank-NN.json`) while torchrun runs.

The progress line and the dead-rank watch look at every rank's record on every tick. A record
grows to about 100 KB, and reading it the way the evidence does (the strict reader, then the
whole `RankRecord` validated) costs milliseconds: at 16 ranks, twice per tick, that was a sixth
of all the CPU a run used. Here one `RecordReader` serves both:

- a file is parsed again only when its stat identity changed: the ranks replace their record
  atomically (a new file renamed over the old), so every write brings a new inode, size or
  modification time;
- only the fields the launcher acts on are validated (`RankStatus`), by pydantic straight from
  the bytes.

Decisions that must see the latest write (is a rank that left really unfinished?) ask for a
`fresh` read, which ignores the cache. The view never becomes evidence: after torchrun exits,
the bundle reads every record in full through the strict reader (`harness.jsonfile`). Here a
file that is not a regular file, too large, not JSON, nested too deep, or not a rank record is
unreadable, as it is there; a duplicate key, which the strict reader refuses, reads as its last
value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass as plain_dataclass
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, NonNegativeInt
from pydantic.dataclasses import dataclass

from harness.jsonfile import read_bounded
from harness.schema.base import adapter_of
from harness.schema.rank_record import Outcome, rank_record_path

# Unknown keys are ignored (they are the rest of the record), but what is read is read strictly.
_VIEW = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


@dataclass(frozen=True, config=_VIEW)
class TestStatus:
    """One test a rank reported: which, and how it ended."""

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: Outcome


@dataclass(frozen=True, config=_VIEW)
class StartStatus:
    """Of a rank's start, what the launcher acts on: its output relay's pid."""

    output_relay: NonNegativeInt | None = None


@dataclass(frozen=True, config=_VIEW)
class FactsStatus:
    """Of a rank's facts, what the launcher acts on: the launcher's node whose torchrun folder
    holds its logs (its --node-rank, which a c10d rendezvous's group rank need not be)."""

    node_index: NonNegativeInt | None = None


@dataclass(frozen=True, config=_VIEW)
class RankStatus:
    """The fields of a `RankRecord` that the launcher acts on while the run lasts (same names
    and types as there)."""

    rank: NonNegativeInt
    schema: Literal["dcpqual-rank-record/v1"]
    pid: NonNegativeInt = 0
    complete: bool = False
    abort_reason: str | None = None
    current_test: str | None = None
    waiting_since: float | None = None
    collected: tuple[str, ...] = ()
    tests: tuple[TestStatus, ...] = ()
    start: StartStatus | None = None
    extra: FactsStatus = FactsStatus()

    @property
    def finished(self) -> bool:
        """Its session ended on its own (complete) or it said why it left (aborted)."""
        return self.complete or self.abort_reason is not None


def read_status(path: Path) -> RankStatus:
    """The status in one record file; JsonFileRefused or ValueError when it has none."""
    status: RankStatus = adapter_of(RankStatus).validate_json(read_bounded(path))
    return status


@plain_dataclass(frozen=True)
class _Stamp:
    """What changes whenever a record file is replaced or rewritten."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: Path) -> _Stamp:
        info = os.stat(path)
        return cls(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class RecordReader:
    """Every rank's `RankStatus` as the records say now, each file parsed only when it changed.

    `parsed` counts the files parsed so far (what a poll costs)."""

    def __init__(self, records_dir: Path, world_size: int) -> None:
        self.records_dir = records_dir
        self.world_size = world_size
        self.parsed = 0
        self._known: dict[int, tuple[_Stamp, RankStatus | None]] = {}

    def status(self, rank: int, *, fresh: bool = False) -> RankStatus | None:
        """Rank `rank`'s status; None while it has no readable record. `fresh`: from the
        file, whatever was read before."""
        path = rank_record_path(self.records_dir, rank)
        try:
            stamp = _Stamp.of(path)
        except OSError:
            self._known.pop(rank, None)
            return None
        known = self._known.get(rank)
        if known is not None and known[0] == stamp and not fresh:
            return known[1]
        self.parsed += 1
        try:
            status: RankStatus | None = read_status(path)
        except ValueError:  # JsonFileRefused, JSON or validation errors
            status = None
        self._known[rank] = (stamp, status)
        return status

    def statuses(self, *, fresh: bool = False) -> dict[int, RankStatus]:
        """The ranks with a readable record, by rank."""
        found = {}
        for rank in range(self.world_size):
            status = self.status(rank, fresh=fresh)
            if status is not None:
                found[rank] = status
        return found
