"""Helpers for tests that launch the real `dcpqual run` (in-process, through the CLI)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from harness.cli import main
from harness.schema.rank_record import RankRecord

SUITES = Path(__file__).resolve().parent.parent / "rank_suites"


def run(out: Path, world: int, suite: str, *extra: str, nnodes: int = 1) -> tuple[int, float]:
    argv = ["run", "--nproc-per-node", str(world), "--tp", str(world * nnodes), "--out", str(out)]
    argv += [*extra, "--", str(SUITES / suite)]
    started = time.monotonic()
    code = main(argv)
    return code, time.monotonic() - started


def receipt(out: Path) -> dict[str, Any]:
    return json.loads((out / "receipt.json").read_text())


def records(out: Path) -> dict[int, RankRecord]:
    return {
        rec.rank: rec
        for rec in (RankRecord.read(p) for p in sorted((out / "records").glob("rank-*.json")))
    }


def processes_of_run(out: Path) -> list[str]:
    """Live processes whose command line or environment names the run's out folder.

    Ranks and torchrun name it on their command line; anything they start inherits
    DCPQUAL_PLAN (which names <out>) in its environment.
    """
    needle = str(out).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if state not in ("Z", "X") and (needle in cmdline or needle in environ):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {command}")
    return found


FAST_S = 90.0  # an injected fault must end the run well inside this


def assert_fault(out: Path, code: int, elapsed: float, rank: int, test: str) -> dict[str, Any]:
    assert code == 1
    assert elapsed < FAST_S, f"fault took {elapsed:.0f}s to end the run"
    assert processes_of_run(out) == []
    data = receipt(out)
    assert data["verdict"] == "fail"
    assert data["run"]["exit_code"] != 0  # ranks exit non-zero, fast exit included
    cause = data["root_cause"]
    assert cause["rank"] == rank, cause
    assert cause["test"].endswith(f"::{test}"), cause
    return data
