"""What every on-disk model shares: frozen, unknown keys refused, and the limitation value.

A model that forbids unknown keys is what lets `dcpqual verify` reject a file that was edited to
say more than its writer wrote, and what lets the committed JSON Schemas under `schemas/` be
exact. Nothing here imports torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    """Base of every on-disk model: immutable, no unknown keys, fields by name or alias."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Limitation(Model):
    """One path that did not run (or a caveat about one): a stable `key` tools match on, and
    the `text` a reviewer reads. Rendered as the line "key: text"."""

    key: str = Field(min_length=1, pattern=r"^[^:\n]+$")
    text: str

    def line(self) -> str:
        return f"{self.key}: {self.text}"

    @classmethod
    def parse(cls, line: str) -> Limitation:
        """The inverse of `line`; a line without "key: " is refused (ValueError)."""
        key, sep, text = line.partition(": ")
        if not sep:
            raise ValueError(f"a limitation reads 'key: text', got {line!r}")
        return cls(key=key, text=text)


def limitation_lines(items: Iterable[Limitation]) -> list[str]:
    return [item.line() for item in items]


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_sha256(value: str) -> bool:
    """A lowercase sha256 hex digest, matched whole (no trailing newline)."""
    return bool(_SHA256_HEX.fullmatch(value))
