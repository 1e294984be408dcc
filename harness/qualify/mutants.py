"""Mutation testing of the harness's own evidence: `nox -s mutants` (weekly, not in CI).

A qualification harness is worth what it can catch. mutmut 3 mutates the warm code, the
combine, the torch transport and the capture detectors one change at a time and runs the fast
unit tests that cover the mutated function, each mutant under a CPU-time limit.

One mutmut run per source file: pyproject's `[tool.dcpqual-mutants.tests]` names each file and
the fast in-process tests that reach it. Each run happens in its own scratch copy
(`mutants-work/<file>/`: the sources, the tests and a pyproject whose `[tool.mutmut]` is the
shared one narrowed to that file and those tests), started fresh, with one OpenMP thread:
mutmut forks its runners from a process that already ran torch, and a forked child blocks on
the OpenMP pool it inherited, which mutmut then reports as a "timeout" that counts as a kill.
This module turns mutmut's results into a JSON report:

- per file: killed, timeout (counts as killed: the mutant made the tests hang), survived,
  no tests (counts as survived: nothing covers it), excluded (listed equivalent mutants) and
  the score `(killed + timeout) / (everything not excluded)`;
- the surviving mutants with their diffs, so the next engineer can write the missing test;
- the equivalent mutants excluded, each with the reason and the diff given in the
  equivalents file. mutmut names mutants by function and number, so an edit can give a name
  to another change: a listed name that no longer exists, whose diff is no longer the listed
  one, or that a test killed, is an error; the list never hides anything silently;
- the files not run, or run only in part (an interrupted run): no score, their counts kept;
- per file, the sha256 of what its scratch copy was made from (`sources_sha256`). A copy
  records it when it is made (`dcpqual-sources.json`), and a report is written only from copies
  whose sources are this checkout's: results of an earlier checkout are never reported as
  today's, with `--no-run` or after a checkout that changed during the run.

`python -m harness.qualify.mutants --out FILE [--equivalents FILE] [--min-score 90]
[--max-children 2] [--file-timeout S] [--no-run] [SOURCE_FILE...]` exits 0 when every file
reaches the minimum score, 1 when one does not (or was not run: its mutants "not checked"),
2 on bad input (one line on stderr, nothing written). The report is never overwritten.
`--entry MUTANT` prints that mutant's equivalents-file entry from its last run instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.atomic import atomic_write_text
from harness.schema.mutants import ExcludedMutant, FileRow, MutantsReportFile, Survivor

KILLED = ("killed", "timeout")
# Statuses counted against the score (anything mutmut says that is not a kill).
NOT_KILLED = ("survived", "no tests", "suspicious", "segfault")
NOT_CHECKED = "not checked"  # generated but not run (a run limited by globs, or interrupted)
# One OpenMP/MKL thread in mutmut and every runner it forks (see the module docstring).
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
WORK = Path("mutants-work")
# What a scratch copy needs: mutmut's source path and its also_copy, plus the tests.
_COPIED = ("harness", "tests", "suites", "conftest.py")
SOURCES_FILE = "dcpqual-sources.json"  # in each scratch copy: the digest of what it was made of
# Left out of that digest: text no test's outcome depends on and that is edited after a run
# (the report and its table, the equivalents list, whose entries are checked by their diffs).
_NOT_SOURCES = ("tests/mutants-report.json", "tests/mutants-equivalent.json")  # and any *.md
_IGNORED = ("__pycache__", "*.pyc")
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


@dataclass(frozen=True)
class Equivalent:
    """A mutant listed as equivalent: why no input can observe it, and the diff it was judged
    on. mutmut numbers mutants per function, so after an edit a name can mean another change;
    the diff is what keeps an exclusion tied to the change that was reviewed."""

    reason: str
    diff: tuple[str, ...]

    def same_change(self, diff: str) -> bool:
        """The listed diff is this one, hunk positions aside (an edit elsewhere in the function
        moves them without changing the mutant or its surroundings)."""
        return _comparable(self.diff) == _comparable(tuple(diff.splitlines()))


_HUNK = re.compile(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@")


def _comparable(lines: Sequence[str]) -> tuple[str, ...]:
    return tuple(_HUNK.sub("@@", line).rstrip() for line in lines if line.strip())


def diff_of(show: str) -> str:
    """`mutmut show NAME` output -> the unified diff alone (without its `# NAME: status`
    header, which changes with the status, not with the mutant)."""
    lines = show.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("--- ")), len(lines))
    return "\n".join(lines[start:]).strip("\n")


def load_equivalents(path: Path) -> dict[str, Equivalent]:
    """{mutant name: Equivalent}; every entry needs a non-empty reason and the mutant's diff
    as a list of lines (`python -m harness.qualify.mutants --entry NAME` prints one)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise MutantsError(f"cannot read equivalents file {path}: {exc}") from None
    entries = data.get("equivalent") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise MutantsError(f"{path}: expected {{'equivalent': {{mutant: {{reason, diff}}}}}}")
    loaded = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict) or set(entry) != {"reason", "diff"}:
            raise MutantsError(
                f"{path}: equivalent mutant {name!r} needs exactly 'reason' and 'diff' "
                "(its `mutmut show` diff as a list of lines)"
            )
        reason, diff = entry["reason"], entry["diff"]
        if not isinstance(reason, str) or not reason.strip():
            raise MutantsError(f"{path}: equivalent mutant {name!r} has no reason")
        if not (isinstance(diff, list) and all(isinstance(x, str) for x in diff)):
            raise MutantsError(f"{path}: equivalent mutant {name!r}: diff is not a list of lines")
        changed = [x[:1] for x in diff if not x.startswith(("--- ", "+++ "))]
        if "-" not in changed and "+" not in changed:
            raise MutantsError(f"{path}: equivalent mutant {name!r}: diff shows no change")
        loaded[name] = Equivalent(reason, tuple(diff))
    return loaded


def entry_for(name: str, diff: str) -> str:
    """The equivalents-file entry for one mutant, its reason left for the reviewer to write."""
    body = {name: {"reason": "", "diff": diff.splitlines()}}
    return json.dumps(body, indent=2, ensure_ascii=False)


@dataclass(frozen=True)
class FileScore:
    """One source file's mutants by outcome, and its score in percent."""

    path: str
    counts: Mapping[str, int]
    excluded: int
    not_checked: int = 0
    sources_sha256: str | None = None

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

    def row(self) -> FileRow:
        return FileRow(
            path=self.path,
            score=round(self.score, 1) if self.ran else None,
            not_checked=self.not_checked,
            killed=self.counts.get("killed", 0),
            timeout=self.counts.get("timeout", 0),
            survived=self.counts.get("survived", 0),
            no_tests=self.counts.get("no tests", 0),
            other=sum(v for k, v in self.counts.items() if k not in (*KILLED, *NOT_KILLED[:2])),
            excluded_equivalent=self.excluded,
            sources_sha256=self.sources_sha256,
        )


@dataclass(frozen=True)
class MutantsReport:
    files: tuple[FileScore, ...]
    survivors: Mapping[str, str]  # name -> diff
    excluded: Mapping[str, Equivalent]
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

    def written(self, minimum: float) -> MutantsReportFile:
        """The report file's value, judged against `minimum`."""
        return MutantsReportFile(
            min_score=minimum,
            score=round(self.score, 1),
            files=tuple(f.row() for f in self.files),
            below_min_score=tuple(f.path for f in self.below(minimum)),
            not_run=tuple(f.path for f in self.not_run),
            survivors=tuple(
                Survivor(mutant=name, file=source_file(name), diff=diff)
                for name, diff in sorted(self.survivors.items())
            ),
            excluded_equivalent=tuple(
                ExcludedMutant(
                    mutant=name,
                    file=source_file(name),
                    reason=entry.reason,
                    diff="\n".join(entry.diff),
                )
                for name, entry in sorted(self.excluded.items())
            ),
            skipped=self.skipped,
        )


def summarize(
    statuses: Mapping[str, str],
    equivalents: Mapping[str, Equivalent],
    diffs: Mapping[str, str],
    files: Iterable[str] = (),
    sources: Mapping[str, str] | None = None,
) -> MutantsReport:
    """Score every file (`files` too: one with no results is listed as not run). A listed
    equivalent leaves the score only if this run produced it, with the listed diff, and no
    test killed it; anything else is an error, never a silent exclusion. `sources`: each file's
    `sources_digest`, as its scratch copy recorded it."""
    unknown = sorted(set(equivalents) - set(statuses))
    if unknown:
        raise MutantsError(
            f"equivalent mutants not produced by this run (stale list?): {', '.join(unknown[:5])}"
        )
    moved = sorted(n for n, e in equivalents.items() if not e.same_change(diffs.get(n, "")))
    if moved:
        raise MutantsError(
            "equivalent mutants whose diff is not the listed one (the name now means another "
            f"change: review it and update or drop the entry): {', '.join(moved[:5])}"
        )
    killed = sorted(n for n in equivalents if statuses[n] in KILLED)
    if killed:
        raise MutantsError(
            f"equivalent mutants killed by the tests (so not equivalent): {', '.join(killed[:5])}"
        )
    counts: dict[str, dict[str, int]] = {path: {} for path in files}
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
    scores = tuple(
        FileScore(
            path,
            counts[path],
            excluded.get(path, 0),
            unchecked.get(path, 0),
            (sources or {}).get(path),
        )
        for path in sorted(counts)
    )
    return MutantsReport(scores, survivors, dict(equivalents), tuple(skipped))


def _mutmut(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "mutmut", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env={**os.environ, **SINGLE_THREAD_ENV},
    )
    if done.returncode != 0:
        raise MutantsError(f"mutmut {' '.join(args)} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


def load_targets(pyproject: Path) -> dict[str, tuple[str, ...]]:
    """`[tool.dcpqual-mutants.tests]`: {source file: the fast tests that reach it}."""
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, ValueError) as exc:
        raise MutantsError(f"cannot read {pyproject}: {exc}") from None
    table = data.get("tool", {}).get("dcpqual-mutants", {}).get("tests")
    if not isinstance(table, dict) or not table:
        raise MutantsError(f"{pyproject}: no [tool.dcpqual-mutants.tests] table")
    for path, tests in table.items():
        if not (isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests)):
            raise MutantsError(f"{pyproject}: {path!r} needs a non-empty list of tests")
    return {path: tuple(tests) for path, tests in table.items()}


def narrowed_pyproject(text: str, path: str, tests: Sequence[str]) -> str:
    """The pyproject with `[tool.mutmut]` narrowed to one source file and its tests."""
    base = tomllib.loads(text).get("tool", {}).get("mutmut", {})
    config = {**base, "only_mutate": [path], "pytest_add_cli_args_test_selection": list(tests)}
    section = "[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items())
    kept, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("["):
            skipping = line.strip() == "[tool.mutmut]"
        if not skipping:
            kept.append(line)
    return "".join(kept).rstrip("\n") + "\n\n" + section


def workdir(work: Path, path: str) -> Path:
    return work / path.removesuffix(".py").replace("/", ".")


def _is_source(rel: Path) -> bool:
    skipped = "__pycache__" in rel.parts or rel.suffix in (".pyc", ".md")
    return not skipped and rel.as_posix() not in _NOT_SOURCES


def sources_digest(tree: Path, pyproject: str) -> str:
    """sha256 of what one file's scratch copy holds, taken from `tree` (the checkout, or the
    copy): every copied file's path and bytes, in order (`_NOT_SOURCES` aside), and the narrowed
    `pyproject` text. A copy made of an unchanged checkout has the checkout's digest."""
    digest = hashlib.sha256()
    for name in _COPIED:
        top = tree / name
        found = sorted(top.rglob("*")) if top.is_dir() else [top] if top.is_file() else []
        for file in found:
            rel = file.relative_to(tree)
            if file.is_file() and _is_source(rel):
                digest.update(rel.as_posix().encode() + b"\0")
                digest.update(hashlib.sha256(file.read_bytes()).digest())
    digest.update(b"pyproject.toml\0" + hashlib.sha256(pyproject.encode()).digest())
    return digest.hexdigest()


def checked_sources(
    root: Path, work: Path, targets: Mapping[str, Sequence[str]], ran: Iterable[str]
) -> dict[str, str]:
    """Each file of `ran`'s recorded sources digest, refused unless it is this checkout's."""
    text = (root / "pyproject.toml").read_text()
    digests: dict[str, str] = {}
    for path in sorted(set(ran)):
        where = workdir(work, path)
        try:
            recorded = json.loads((where / SOURCES_FILE).read_text())["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            raise MutantsError(
                f"{where} does not say what it was made from (no valid {SOURCES_FILE}): "
                "run it again without --no-run"
            ) from None
        if recorded != sources_digest(root, narrowed_pyproject(text, path, targets[path])):
            raise MutantsError(
                f"{where} was made from other sources than this checkout's {path} (or its "
                "tests): run it again without --no-run"
            )
        digests[path] = recorded
    return digests


def run_target(
    root: Path, work: Path, path: str, tests: Sequence[str], *, children: int, limit: float
) -> bool:
    """One fresh mutmut run over one file in its scratch copy; False if it ran out of time
    (its unfinished mutants then stay "not checked")."""
    where = workdir(work, path)
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    for name in _COPIED:
        source = root / name
        if source.is_dir():
            ignore = shutil.ignore_patterns(*_IGNORED)
            shutil.copytree(source, where / name, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, where / name)
    text = narrowed_pyproject((root / "pyproject.toml").read_text(), path, tests)
    (where / "pyproject.toml").write_text(text)
    sources = json.dumps({"sha256": sources_digest(where, text)})
    (where / SOURCES_FILE).write_text(sources + "\n")
    print(f"mutants: {path} with {' '.join(tests)}", flush=True)
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(children)]
    env = {**os.environ, **SINGLE_THREAD_ENV}
    with subprocess.Popen(command, cwd=where, env=env, start_new_session=True) as proc:
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(f"mutants: {path} stopped after {limit:.0f} s; the rest stays unchecked")
            return False
    return True


def collect(work: Path, targets: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Every target's mutant statuses from its scratch copy (a target never run has none)."""
    statuses: dict[str, str] = {}
    for path in targets:
        where = workdir(work, path)
        if not (where / "mutants").is_dir():
            continue
        found = parse_results(_mutmut("results", "--all", "true", cwd=where))
        statuses.update({n: s for n, s in found.items() if source_file(n) == path})
    return statuses


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
    parser.add_argument("--out", type=Path, help="JSON report (must not exist; required)")
    parser.add_argument(
        "--equivalents", type=Path, help="JSON {'equivalent': {mutant: {reason, diff}}}"
    )
    parser.add_argument(
        "--entry",
        metavar="MUTANT",
        help="print MUTANT's equivalents-file entry (from its last run) and exit; no report",
    )
    parser.add_argument("--min-score", type=float, default=90.0, help="per file, percent")
    parser.add_argument("--max-children", type=int, default=2, help="mutmut runners at once")
    parser.add_argument(
        "--file-timeout", type=float, default=3600.0, help="seconds per file before it stops"
    )
    parser.add_argument("--work", type=Path, default=WORK, help="scratch copies, one per file")
    parser.add_argument("--no-run", action="store_true", help="report the last runs")
    parser.add_argument("files", nargs="*", help="source files (default: every listed one)")
    args = parser.parse_args(argv)
    root = Path.cwd()
    try:
        if args.entry:
            where = workdir(args.work, source_file(args.entry))
            print(entry_for(args.entry, diff_of(_mutmut("show", args.entry, cwd=where))))
            return 0
        if args.out is None:
            raise MutantsError("--out FILE is required (or --entry MUTANT)")
        if args.out.exists():
            raise MutantsError(f"{args.out} exists; a report is never overwritten")
        if args.max_children < 1 or args.file_timeout <= 0:
            raise MutantsError("--max-children and --file-timeout must be positive")
        equivalents = load_equivalents(args.equivalents) if args.equivalents else {}
        targets = load_targets(root / "pyproject.toml")
        unknown = sorted(set(args.files) - set(targets))
        if unknown:
            raise MutantsError(f"not in [tool.dcpqual-mutants.tests]: {', '.join(unknown)}")
        chosen = {p: targets[p] for p in (args.files or targets)}
        if not args.no_run:
            for path, tests in chosen.items():
                run_target(
                    root,
                    args.work,
                    path,
                    tests,
                    children=args.max_children,
                    limit=args.file_timeout,
                )
        statuses = collect(args.work, chosen)
        if not statuses:
            raise MutantsError(f"no mutmut results under {args.work} (did `mutmut run` run?)")
        # A file that did not run cannot confirm its listed equivalents; it is reported not run.
        produced = {source_file(name) for name in statuses}
        sources = checked_sources(root, args.work, chosen, produced)
        equivalents = {n: e for n, e in equivalents.items() if source_file(n) in produced}
        diffs = {
            name: diff_of(_mutmut("show", name, cwd=workdir(args.work, source_file(name))))
            for name, status in statuses.items()
            if status in NOT_KILLED or name in equivalents
        }
        report = summarize(statuses, equivalents, diffs, chosen, sources)
    except MutantsError as exc:
        print(f"mutants: {exc}", file=sys.stderr)
        return 2
    atomic_write_text(args.out, report.written(args.min_score).text())
    print(render(report, args.min_score))
    print(f"report: {args.out}")
    return 1 if report.below(args.min_score) or report.not_run else 0


if __name__ == "__main__":
    sys.exit(main())
