"""Mutation testing of the harness's own evidence: `nox -s mutants` (weekly, not in CI).

A qualification harness is worth what it can catch. mutmut 3 (configured in pyproject's
`[tool.mutmut]`) mutates the warm code, the combine, the torch transport and the capture
detectors one change at a time and runs the fast unit tests that cover the mutated function,
each mutant under a CPU-time limit. This module turns mutmut's results into a JSON report:

- per file: killed, timeout (counts as killed: the mutant made the tests hang), survived,
  no tests (counts as survived: nothing covers it), excluded (listed equivalent mutants) and
  the score `(killed + timeout) / (everything not excluded)`;
- the surviving mutants with their diffs, so the next engineer can write the missing test;
- the equivalent mutants excluded, each with the reason given in the equivalents file. A
  listed name that no longer exists is an error: the list never hides anything silently;
- the files not run, or run only in part (an interrupted run): no score, their counts kept.

`python -m harness.qualify.mutants --out FILE [--equivalents FILE] [--min-score 90]
[--no-run] [GLOB...]` exits 0 when every file reaches the minimum score, 1 when one does not
(or was not run: its mutants "not checked"), 2 on bad input (one line on stderr, nothing
written). The report is never overwritten.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.atomic import atomic_write_text

SCHEMA = "dcpqual-mutants/v1"
KILLED = ("killed", "timeout")
# Statuses counted against the score (anything mutmut says that is not a kill).
NOT_KILLED = ("survived", "no tests", "suspicious", "segfault")
NOT_CHECKED = "not checked"  # generated but not run (a run limited by globs, or interrupted)
_RESULT_LINE = re.compile(r"^\s*(?P<name>[\w.ǁ]+__mutmut_\d+): (?P<status>[a-z ]+?)\s*$")


class MutantsError(ValueError):
    """Unusable input (the CLI prints it on one line and exits 2)."""


def parse_results(text: str) -> dict[str, str]:
    """`mutmut results --all true` output -> {mutant name: status}."""
    statuses = {}
    for line in text.splitlines():
        match = _RESULT_LINE.match(line)
        if match:
            statuses[match["name"]] = match["status"]
    return statuses


def source_file(mutant: str) -> str:
    """`harness.warm.warmup.x_warm__mutmut_3` or `harness.a.b.xǁClassǁmethod__mutmut_1`
    -> `harness/warm/warmup.py` (the module is every dotted part before the function's)."""
    parts = mutant.split(".")
    for index, part in enumerate(parts):
        if part.startswith(("x_", "xǁ")):
            if index == 0:
                break
            return "/".join(parts[:index]) + ".py"
    raise MutantsError(f"not a mutmut 3 mutant name: {mutant!r}")


def load_equivalents(path: Path) -> dict[str, str]:
    """{mutant name: why it is equivalent}; every entry needs a non-empty reason."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise MutantsError(f"cannot read equivalents file {path}: {exc}") from None
    entries = data.get("equivalent") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise MutantsError(f"{path}: expected {{'equivalent': {{mutant: reason}}}}")
    for name, reason in entries.items():
        if not isinstance(reason, str) or not reason.strip():
            raise MutantsError(f"{path}: equivalent mutant {name!r} has no reason")
    return dict(entries)


@dataclass(frozen=True)
class FileScore:
    """One source file's mutants by outcome, and its score in percent."""

    path: str
    counts: Mapping[str, int]
    excluded: int
    not_checked: int = 0

    @property
    def ran(self) -> bool:
        """Every mutant of the file was run (an interrupted or partial run is not scored)."""
        return self.not_checked == 0 and (self.scored > 0 or self.excluded > 0)

    @property
    def killed(self) -> int:
        return sum(self.counts.get(status, 0) for status in KILLED)

    @property
    def scored(self) -> int:
        return sum(self.counts.values())

    @property
    def score(self) -> float:
        return 100.0 if self.scored == 0 else 100.0 * self.killed / self.scored

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "score": round(self.score, 1) if self.ran else None,
            "not_checked": self.not_checked,
            "killed": self.counts.get("killed", 0),
            "timeout": self.counts.get("timeout", 0),
            "survived": self.counts.get("survived", 0),
            "no_tests": self.counts.get("no tests", 0),
            "other": sum(v for k, v in self.counts.items() if k not in (*KILLED, *NOT_KILLED[:2])),
            "excluded_equivalent": self.excluded,
        }


@dataclass(frozen=True)
class MutantsReport:
    files: tuple[FileScore, ...]
    survivors: Mapping[str, str]  # name -> diff
    excluded: Mapping[str, str]  # name -> reason
    skipped: tuple[str, ...] = field(default=())  # mutmut "skipped": not counted, listed

    @property
    def score(self) -> float:
        scored = sum(f.scored for f in self.files)
        return 100.0 if scored == 0 else 100.0 * sum(f.killed for f in self.files) / scored

    def below(self, minimum: float) -> tuple[FileScore, ...]:
        return tuple(f for f in self.files if f.ran and f.score < minimum)

    @property
    def not_run(self) -> tuple[FileScore, ...]:
        return tuple(f for f in self.files if not f.ran)

    def to_json(self, minimum: float) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool": "mutmut",
            "min_score": minimum,
            "score": round(self.score, 1),
            "files": [f.to_json() for f in self.files],
            "below_min_score": [f.path for f in self.below(minimum)],
            "not_run": [f.path for f in self.not_run],
            "survivors": [
                {"mutant": name, "file": source_file(name), "diff": diff}
                for name, diff in sorted(self.survivors.items())
            ],
            "excluded_equivalent": [
                {"mutant": name, "file": source_file(name), "reason": reason}
                for name, reason in sorted(self.excluded.items())
            ],
            "skipped": list(self.skipped),
        }


def summarize(
    statuses: Mapping[str, str], equivalents: Mapping[str, str], diffs: Mapping[str, str]
) -> MutantsReport:
    """Score every file; listed equivalents leave the score, but must still exist."""
    unknown = sorted(set(equivalents) - set(statuses))
    if unknown:
        raise MutantsError(
            f"equivalent mutants not produced by this run (stale list?): {', '.join(unknown[:5])}"
        )
    counts: dict[str, dict[str, int]] = {}
    excluded: dict[str, int] = {}
    unchecked: dict[str, int] = {}
    survivors: dict[str, str] = {}
    skipped = []
    for name, status in sorted(statuses.items()):
        path = source_file(name)
        counts.setdefault(path, {})
        if name in equivalents:
            excluded[path] = excluded.get(path, 0) + 1
        elif status == "skipped":
            skipped.append(name)
        elif status == NOT_CHECKED:
            unchecked[path] = unchecked.get(path, 0) + 1
        else:
            counts[path][status] = counts[path].get(status, 0) + 1
            if status not in KILLED:
                survivors[name] = diffs.get(name, "")
    files = tuple(
        FileScore(path, counts[path], excluded.get(path, 0), unchecked.get(path, 0))
        for path in sorted(counts)
    )
    excluded_reasons = {name: equivalents[name] for name in equivalents}
    return MutantsReport(files, survivors, excluded_reasons, tuple(skipped))


def _mutmut(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "mutmut", *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise MutantsError(f"mutmut {' '.join(args)} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


def render(report: MutantsReport, minimum: float) -> str:
    lines = [f"mutation score {report.score:.1f}% (minimum {minimum:.0f}% per file)"]
    for f in report.files:
        if not f.ran:
            done = f"{f.scored} of {f.scored + f.not_checked} run" if f.scored else "not run"
            lines.append(f"  --- {done}, no score  {f.path}")
            continue
        mark = "ok " if f.score >= minimum else "LOW"
        lines.append(
            f"  {mark} {f.score:5.1f}%  {f.path}  killed {f.killed}/{f.scored}"
            + (f", {f.excluded} equivalent excluded" if f.excluded else "")
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.qualify.mutants", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="JSON report (must not exist)")
    parser.add_argument("--equivalents", type=Path, help="JSON {'equivalent': {mutant: reason}}")
    parser.add_argument("--min-score", type=float, default=90.0, help="per file, percent")
    parser.add_argument("--no-run", action="store_true", help="report the last mutmut run")
    parser.add_argument("globs", nargs="*", help="mutant name globs for `mutmut run`")
    args = parser.parse_args(argv)
    try:
        if args.out.exists():
            raise MutantsError(f"{args.out} exists; a report is never overwritten")
        equivalents = load_equivalents(args.equivalents) if args.equivalents else {}
        if not args.no_run:
            subprocess.run([sys.executable, "-m", "mutmut", "run", *args.globs], check=False)
        statuses = parse_results(_mutmut("results", "--all", "true"))
        if not statuses:
            raise MutantsError("mutmut reported no mutants (did `mutmut run` run?)")
        if args.globs:
            pattern = re.compile("|".join(_glob(g) for g in args.globs))
            statuses = {n: s for n, s in statuses.items() if pattern.fullmatch(n)}
            equivalents = {n: r for n, r in equivalents.items() if pattern.fullmatch(n)}
        diffs = {
            name: _mutmut("show", name)
            for name, status in statuses.items()
            if status in NOT_KILLED and name not in equivalents
        }
        report = summarize(statuses, equivalents, diffs)
    except MutantsError as exc:
        print(f"mutants: {exc}", file=sys.stderr)
        return 2
    atomic_write_text(args.out, json.dumps(report.to_json(args.min_score), indent=2) + "\n")
    print(render(report, args.min_score))
    print(f"report: {args.out}")
    return 1 if report.below(args.min_score) or report.not_run else 0


def _glob(pattern: str) -> str:
    return ".*".join(re.escape(part) for part in pattern.split("*"))


if __name__ == "__main__":
    sys.exit(main())
