"""This rank's engine-lane record, kept where the rank plugin's use hook reads it (torch-free)."""

from __future__ import annotations

from harness.schema.rank_record import EngineRecord

_RECORD: list[EngineRecord] = []


def set_engine_record(record: EngineRecord) -> None:
    _RECORD[:] = [record]


def engine_record() -> EngineRecord | None:
    return _RECORD[0] if _RECORD else None
