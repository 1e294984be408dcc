"""What an interpreter started with PYTHONHASHSEED=SEED hashes the rank records' probe string
to, computed as CPython 3.11+ does on a 64-bit little-endian machine: SipHash-1-3 over the
string's bytes, keyed by the bytes CPython's bootstrap derives from the seed (0: all zero).

Verify holds each seed the records state to the probe its ranks hashed: ranks that all started
from one interpreter with another seed than their environment says (a forkserver started
without it) hash the probe alike, but not as their stated seed does.
"""

from __future__ import annotations

import re

from harness.schema.rank_record import HASH_PROBE

_MASK = (1 << 64) - 1
# The machines and interpreters whose string hash this module computes (`Environment`'s
# `platform` and `python`): elsewhere verify does not hold the probe to the seed.
_MACHINES = ("x86_64", "aarch64", "arm64", "AMD64")
_PYTHON = re.compile(r"(\d+)\.(\d+)")


def computable(python: str, platform: str) -> bool:
    """Whether ranks of that `python` on that `platform` hash strings as `probe_hash` does."""
    found = _PYTHON.match(python)
    return (
        found is not None
        and (int(found[1]), int(found[2])) >= (3, 11)
        and platform.endswith(_MACHINES)
    )


def probe_hash(seed: int, text: str = HASH_PROBE) -> int:
    """hash(`text`) (a Latin-1 string) in an interpreter started with PYTHONHASHSEED=`seed`."""
    data = text.encode("latin-1")
    if not data:
        return 0
    key = _secret(seed)
    value = _siphash13(int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little"), data)
    if value >= 1 << 63:
        value -= 1 << 64
    return -2 if value == -1 else value


def _secret(seed: int) -> bytes:
    """CPython's hash secret for a seed (bootstrap_hash.c `lcg_urandom`)."""
    if seed == 0:
        return bytes(24)
    x, out = seed, bytearray()
    for _ in range(24):
        x = (x * 214013 + 2531011) & 0xFFFFFFFF
        out.append((x >> 16) & 0xFF)
    return bytes(out)


def _rotl(x: int, bits: int) -> int:
    return ((x << bits) | (x >> (64 - bits))) & _MASK


def _round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    v0 = (v0 + v1) & _MASK
    v2 = (v2 + v3) & _MASK
    v1 = _rotl(v1, 13) ^ v0
    v3 = _rotl(v3, 16) ^ v2
    v0 = _rotl(v0, 32)
    v2 = (v2 + v1) & _MASK
    v0 = (v0 + v3) & _MASK
    v1 = _rotl(v1, 17) ^ v2
    v3 = _rotl(v3, 21) ^ v0
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def _siphash13(k0: int, k1: int, data: bytes) -> int:
    v0, v1 = k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D
    v2, v3 = k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573
    whole = len(data) // 8 * 8
    for i in range(0, whole, 8):
        m = int.from_bytes(data[i : i + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
        v0 ^= m
    b = ((len(data) << 56) & _MASK) | int.from_bytes(data[whole:], "little")
    v3 ^= b
    v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    v0 ^= b
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3
