"""Hostile JSON files through the real CLI: one line on stderr and exit 2, never a hang,
a traceback or memory eaten, and nothing written.

`compare` uses exit 1 for "HEAD regresses", so a bad file there must be 2, not 1. Every case
runs `python -m harness` as its own process (forked from a preloaded interpreter,
`_support.forked_cli`) with a time and memory limit, so a reader that hangs on a FIFO or reads
/dev/zero to the end fails the test instead of the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from _support import forked_cli
from _support.evidence_factory import passing_run

from harness.evidence.writer import finalize_bundle
from harness.jsonfile import JsonFileRefused, JsonSyntaxError, loads_strict, nesting_depth

REPO = Path(__file__).resolve().parent.parent
MEMORY_LIMIT = 2 << 30


def dcpqual(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return forked_cli.run(argv, cwd=REPO, timeout=timeout, memory_limit=MEMORY_LIMIT)


def assert_one_line_exit_2(done: subprocess.CompletedProcess[str], command: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"dcpqual {command}: error: "), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    return lines[0]


def deep(path: Path, depth: int = 200_000) -> None:
    path.write_text("[" * depth + "]" * depth)


def huge(path: Path) -> None:
    with path.open("wb") as fh:  # sparse: no disk is used, but the size says 65 MiB
        fh.truncate(65 << 20)


def fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "bundle"
    finalize_bundle(out, passing_run(out, world=2))
    return out


@pytest.fixture
def bundle(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(pristine, copy)
    return copy


# -- lock check -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, needle",
    [(fifo, "is a FIFO"), (deep, "nests 200000 deep"), (huge, "more than the")],
    ids=["fifo", "deep", "huge"],
)
def test_lock_check_refuses_a_hostile_file(
    tmp_path: Path, make: Callable[[Path], None], needle: str
) -> None:
    lock = tmp_path / "source.lock.json"
    make(lock)
    line = assert_one_line_exit_2(dcpqual("lock", "check", str(lock), timeout=30), "lock")
    assert needle in line


def test_lock_check_on_dev_zero_is_refused_without_reading_it() -> None:
    line = assert_one_line_exit_2(dcpqual("lock", "check", "/dev/zero", timeout=30), "lock")
    assert "/dev/zero: is a device, not a regular file" in line


# -- verify and compare -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, needle", [(deep, "nests 200000 deep"), (huge, "more than the")], ids=["deep", "huge"]
)
def test_verify_and_compare_refuse_a_hostile_receipt_with_exit_2(
    bundle: Path, pristine: Path, make: Callable[[Path], None], needle: str
) -> None:
    (bundle / "receipt.json").unlink()
    make(bundle / "receipt.json")
    before = sorted(p.name for p in bundle.rglob("*"))
    assert needle in assert_one_line_exit_2(dcpqual("verify", str(bundle)), "verify")
    for base, head in ((pristine, bundle), (bundle, pristine)):
        done = dcpqual("compare", str(base), str(head))
        assert needle in assert_one_line_exit_2(done, "compare")
    assert sorted(p.name for p in bundle.rglob("*")) == before


def test_verify_does_not_open_a_fifo_receipt(bundle: Path) -> None:
    (bundle / "receipt.json").unlink()
    fifo(bundle / "receipt.json")
    done = dcpqual("verify", str(bundle), timeout=30)
    assert done.returncode == 1, done.stderr
    assert "receipt.json: is a other, not a file" in done.stdout


def test_a_hostile_rank_record_is_an_unreadable_record_not_a_crash(bundle: Path) -> None:
    record = bundle / "records" / "rank-01.json"
    record.unlink()
    deep(record)
    done = dcpqual("verify", str(bundle))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "receipt.json: ranks.complete is 2 but the rank records" in done.stdout


# -- the reader itself ------------------------------------------------------------------------


def test_duplicate_keys_and_nan_are_not_strict_json() -> None:
    with pytest.raises(JsonSyntaxError, match="duplicate key 'a'"):
        loads_strict('{"a": 1, "b": {}, "a": 2}')
    with pytest.raises(JsonSyntaxError, match="NaN is not a JSON value"):
        loads_strict('{"a": NaN}')


def test_depth_ignores_brackets_inside_strings() -> None:
    assert nesting_depth('{"a": ["[[[", "\\"[{"]}') == 2
    assert loads_strict('["' + "[" * 1000 + '"]') == ["[" * 1000]
    with pytest.raises(JsonFileRefused, match="nests 65 deep"):
        loads_strict("[" * 65 + "]" * 65)
