"""The mutation report `python -m harness.qualify.mutants --out FILE` writes (and the committed
`tests/mutants-report.json`): per file its mutants by outcome and score, then every survivor and
every excluded equivalent with its diff, so a reader can check each exclusion."""

from __future__ import annotations

import json
from typing import Final, Literal

from pydantic import Field, NonNegativeInt

from harness.schema.base import Model

MUTANTS_SCHEMA: Final = "dcpqual-mutants/v1"


class FileRow(Model):
    """One source file: `score` in percent, None when not every mutant of it ran;
    `sources_sha256`: what its run mutated and tested (None in rows older than the digest)."""

    path: str
    score: float | None
    not_checked: NonNegativeInt
    killed: NonNegativeInt
    timeout: NonNegativeInt
    survived: NonNegativeInt
    no_tests: NonNegativeInt
    other: NonNegativeInt
    excluded_equivalent: NonNegativeInt
    sources_sha256: str | None = None


class Survivor(Model):
    mutant: str
    file: str
    diff: str


class ExcludedMutant(Model):
    """A listed equivalent mutant, with the reason it was judged equivalent on that diff."""

    mutant: str
    file: str
    reason: str = Field(min_length=1)
    diff: str


class MutantsReportFile(Model):
    schema_: Literal["dcpqual-mutants/v1"] = Field(default=MUTANTS_SCHEMA, alias="schema")
    tool: Literal["mutmut"] = "mutmut"
    min_score: float
    score: float
    files: tuple[FileRow, ...]
    below_min_score: tuple[str, ...]
    not_run: tuple[str, ...]
    survivors: tuple[Survivor, ...]
    excluded_equivalent: tuple[ExcludedMutant, ...]
    skipped: tuple[str, ...]

    def text(self) -> str:
        """The file's text (non-ASCII escaped, as mutmut's `ǁ` method names are)."""
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=2) + "\n"
