"""A large log is scrubbed a block at a time: the same result as scrubbing it whole, no form of
a secret left at any block boundary, and memory bounded by the block, not the file. So is what a
gzip file too large to scrub whole holds."""

from __future__ import annotations

import base64
import gzip
import random
import tracemalloc
from pathlib import Path

import pytest

from harness.core import secrets
from harness.core.secrets import GZIP_MAGIC, SCRUBBED, Scrubber
from harness.evidence import redact
from harness.evidence.redact import scrub_folder, scrub_stream

SECRET = "hf_StreamSecret0123456789abcdef"
WRAPPED = base64.encodebytes(("x" * 100 + SECRET + "y" * 100).encode())  # lines of 76


def _log(lines: int, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        words = [rng.choice(["step", "loss", "rank", "ok", "x" * rng.randint(1, 300)])]
        if i % 37 == 0:
            words.append(f"token={SECRET!r}")
        if i % 53 == 0:
            words.append(f"HF_TOKEN={SECRET}")
        out.append(" ".join(words).encode())
        if i % 101 == 0:
            out.append(WRAPPED)
    return b"\n".join(out) + b"\n"


@pytest.mark.parametrize("block", [400, 1000, 4096])
def test_a_log_scrubbed_in_blocks_is_the_log_scrubbed_whole(tmp_path: Path, block: int) -> None:
    scrubber = Scrubber.of([SECRET])
    data = _log(600)
    path = tmp_path / "rank.log"
    path.write_bytes(data)
    hits = scrub_stream(path, scrubber, block=block)
    whole, whole_hits = scrubber.data(data)
    assert path.read_bytes() == whole and hits == whole_hits > 0
    assert SECRET.encode() not in path.read_bytes()


@pytest.mark.parametrize("block", [50, 333, 4096])
def test_one_endless_line_keeps_no_secret_at_any_cut(tmp_path: Path, block: int) -> None:
    """No newline, no whitespace: every cut is forced, and none may split a form."""
    scrubber = Scrubber.of([SECRET])
    data = b"".join(b"z" * (i % 41) + SECRET.encode() for i in range(400))
    path = tmp_path / "endless.log"
    path.write_bytes(data)
    assert scrub_stream(path, scrubber, block=block) == 400
    cleaned = path.read_bytes()
    assert SECRET.encode() not in cleaned and cleaned.count(SCRUBBED.encode()) == 400


def test_a_large_log_costs_about_two_blocks_of_memory(tmp_path: Path) -> None:
    scrubber = Scrubber.of([SECRET])
    path = tmp_path / "huge.log"
    line = b"step 1 loss 0.5 " + b"q" * 200 + b"\n"
    with path.open("wb") as fh:
        for _ in range(12):
            fh.write(line * 5000)  # ~1 MiB
            fh.write(f"HF_TOKEN={SECRET}\n".encode())
    size = path.stat().st_size
    tracemalloc.start()
    try:
        hits = scrub_stream(path, scrubber, block=256 << 10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert hits == 12 and SECRET.encode() not in path.read_bytes()
    assert peak < 4 << 20 < size / 2, f"peak {peak >> 20} MiB for a {size >> 20} MiB log"


def test_the_folder_scrub_streams_large_logs_and_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redact, "STREAM_BYTES", 1000)
    monkeypatch.setattr(redact, "STREAM_BLOCK", 512)
    (tmp_path / "torchrun").mkdir()
    big = tmp_path / "torchrun" / "stdout.log"
    big.write_bytes(_log(200))
    small = tmp_path / "note.txt"
    small.write_text(f"HF_TOKEN={SECRET}\n")
    report = scrub_folder(tmp_path, Scrubber.of([SECRET]))
    assert set(report.changed) == {"torchrun/stdout.log", "note.txt"}
    assert SECRET not in big.read_text() and SECRET not in small.read_text()
    assert [p.name for p in (tmp_path / "torchrun").iterdir()] == ["stdout.log"]  # no temp left


def _gzip_members(*parts: bytes) -> bytes:
    return b"".join(gzip.compress(part, compresslevel=1, mtime=0) for part in parts)


@pytest.fixture
def small_gzip_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gzip file past 64 KiB decompressed or 8 KiB compressed is too large to scrub whole."""
    monkeypatch.setattr(secrets, "GZIP_LIMIT", 64 << 10)
    monkeypatch.setattr(redact, "GZIP_LIMIT", 64 << 10)
    monkeypatch.setattr(redact, "STREAM_BYTES", 8 << 10)


@pytest.mark.usefixtures("small_gzip_limits")
def test_a_gzip_file_too_large_to_scrub_whole_is_scrubbed_inside(tmp_path: Path) -> None:
    """A compressed log past the limits (256 MiB decompressed, 32 MiB compressed) is scrubbed a
    block at a time and compressed again: what it holds is what it held, less the secret."""
    held = f"auth {SECRET}\n".encode() + b"\0" * (300 << 10) + f"again {SECRET}\n".encode()
    noise = random.Random(3).randbytes(20 << 10).hex().encode() + f" {SECRET}\n".encode()
    (tmp_path / "big.log.gz").write_bytes(_gzip_members(held[:1000], held[1000:]))
    (tmp_path / "noisy.log.gz").write_bytes(_gzip_members(noise))
    assert len((tmp_path / "noisy.log.gz").read_bytes()) > redact.STREAM_BYTES
    report = scrub_folder(tmp_path, Scrubber.of([SECRET]))
    assert sorted(report.changed) == ["big.log.gz", "noisy.log.gz"]
    big = gzip.decompress((tmp_path / "big.log.gz").read_bytes())
    assert big == held.replace(SECRET.encode(), SCRUBBED.encode())
    noisy = gzip.decompress((tmp_path / "noisy.log.gz").read_bytes())
    assert noisy == noise.replace(SECRET.encode(), SCRUBBED.encode())


@pytest.mark.usefixtures("small_gzip_limits")
def test_a_gzip_file_that_breaks_off_keeps_no_secret(tmp_path: Path) -> None:
    """Cut short (a test killed as it wrote), or followed by plain bytes: what can be read is
    scrubbed and the break dropped; plain bytes after a clean member are scrubbed as bytes."""
    held = f"auth {SECRET}\n".encode() + b"\0" * (300 << 10)
    (tmp_path / "cut.log.gz").write_bytes(_gzip_members(held)[:-64])
    (tmp_path / "appended.gz").write_bytes(_gzip_members(b"\0" * (100 << 10)) + SECRET.encode())
    scrub_folder(tmp_path, Scrubber.of([SECRET]))
    cut = gzip.decompress((tmp_path / "cut.log.gz").read_bytes())
    assert cut.startswith(f"auth {SCRUBBED}\n".encode()) and SECRET.encode() not in cut
    assert SECRET.encode() not in (tmp_path / "appended.gz").read_bytes()


def test_a_large_file_that_only_starts_like_gzip_is_scrubbed_as_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redact, "STREAM_BYTES", 1 << 10)
    data = GZIP_MAGIC + b"not gzip " * 400 + SECRET.encode() + b"\n"
    (tmp_path / "blob.bin").write_bytes(data)
    scrub_folder(tmp_path, Scrubber.of([SECRET]))
    assert (tmp_path / "blob.bin").read_bytes() == data.replace(SECRET.encode(), SCRUBBED.encode())
