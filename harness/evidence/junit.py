"""Merge the per-rank JUnit reports into `junit/merged.xml` and count outcomes per suite.

`merged.xml` holds one `<testsuite>` per suite and one `<testcase>` per test (node id), so a CI
test reporter counts tests, not rank cases. The testcase is the worst rank's (its failure text),
and carries every rank's outcome as properties: `dcpqual.suite`, and per rank NN
`dcpqual.rank.NN` (its outcome), `dcpqual.source.NN` (`junit` when copied from the rank's own
report, `record` when rebuilt from its rank record because the report is missing,
`synthesized` for the error case that attributes a dead rank, as xdist does for a dead worker)
`dcpqual.message.NN` (its message, where it has one) and `dcpqual.host.NN` (the digest of
its host, never the name). The ranks' own reports stay in
junit/rank-NN.xml. Bundles written before read as one testsuite per rank with `dcpqual.rank`
on each case; `read_merged` reads both.

Tallies count *tests*, not rank cases: a test that ran on 16 ranks counts once, as `failed` if
it failed on any rank, else `error` if it errored on any, else `passed` if it passed on any, else
`skipped`. `rank_cases` keeps the number of testcases behind it. `dcpqual verify` recomputes the
tallies from `merged.xml` with the same function.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path

from junitparser import (
    Error,
    Failure,
    JUnitXml,
    JUnitXmlError,
    Properties,
    Property,
    Skipped,
    TestCase,
    TestSuite,
)

from harness.evidence.collect import RankFiles, in_progress
from harness.evidence.environment import host_digest
from harness.schema.rank_record import RankRecord, junit_path, suite_of
from harness.schema.receipt import Tally

PROP_RANK = "dcpqual.rank"
PROP_SUITE = "dcpqual.suite"
PROP_SOURCE = "dcpqual.source"
PROP_MESSAGE = "dcpqual.message"
PROP_HOST = "dcpqual.host"
_PER_RANK = re.compile(r"^dcpqual\.(rank|source|message)\.(\d+)$")
LIFECYCLE_SUITE = "ranks"  # suite of the synthesized cases of ranks that left nothing
OUTCOME_ORDER = ("failed", "error", "passed", "skipped")  # precedence across ranks


def mangle(nodeid: str) -> tuple[str, str]:
    """(classname, name) pytest's --junitxml writes for a node id (its mangle_test_address)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def suite_of_classname(classname: str) -> str:
    """Suite of a JUnit classname, agreeing with `suite_of` on the node id it came from."""
    parts = classname.split(".")
    while len(parts) > 1 and parts[-1][:1].isupper():  # drop test classes
        parts.pop()
    return suite_of("/".join(parts) + ".py")


@dataclass(frozen=True)
class Case:
    """One testcase of merged.xml, as a value."""

    rank: int
    suite: str
    classname: str
    name: str
    outcome: str  # passed | failed | error | skipped
    message: str
    source: str  # junit | record | synthesized


@dataclass(frozen=True)
class MergedJUnit:
    xml: bytes
    cases: tuple[Case, ...]
    missing: tuple[int, ...]  # ranks whose report was missing or unreadable
    notes: tuple[str, ...]  # one line per unreadable report

    def failures(self) -> list[tuple[int, str, str]]:
        """(rank, test, message) of failing cases, by rank."""
        return [
            (c.rank, f"{c.classname}::{c.name}", c.message)
            for c in sorted(self.cases, key=lambda c: c.rank)
            if c.outcome in ("failed", "error")
        ]


def _outcome(case: TestCase) -> tuple[str, str]:
    results = case.result
    for kind, outcome in ((Failure, "failed"), (Error, "error"), (Skipped, "skipped")):
        for result in results:
            if isinstance(result, kind):
                first_line = next(iter((result.text or "").strip().splitlines()), "")
                return outcome, result.message or first_line
    return "passed", ""


def _props(case: TestCase) -> dict[str, str]:
    found = case._elem.find("properties")
    if found is None:
        return {}
    return {p.name: p.value for p in Properties.fromelem(found)}


def _case(nodeid: str, outcome: str, message: str | None, duration: float = 0.0) -> TestCase:
    classname, name = mangle(nodeid)
    case = TestCase(name=name, classname=classname, time=round(duration, 3))
    if outcome == "failed":
        case.result = [Failure(message or "failed")]
    elif outcome == "error":
        case.result = [Error(message or "error")]
    elif outcome == "skipped":
        case.result = [Skipped(message or "skipped")]
    return case


def _lifecycle_case(rank: int, name: str, message: str) -> TestCase:
    case = TestCase(name=f"rank_{rank:02d}_{name}", classname="dcpqual.ranks", time=0.0)
    case.result = [Error(message)]
    return case


def _from_record(rank: int, record: RankRecord | None) -> list[tuple[TestCase, str, str]]:
    """(case, suite, source) rebuilt from a rank record when the rank left no JUnit report."""
    if record is None:
        msg = f"rank {rank} left neither a JUnit report nor a readable rank record"
        return [(_lifecycle_case(rank, "started", msg), LIFECYCLE_SUITE, "synthesized")]
    cases = [
        (_case(t.nodeid, t.outcome, t.message, t.duration_s), suite_of(t.nodeid), "record")
        for t in record.tests
    ]
    if not record.complete:
        test = in_progress(record)
        if test is None:
            msg = f"rank {rank} died after its last test, before its session finished"
            cases.append((_lifecycle_case(rank, "finished", msg), LIFECYCLE_SUITE, "synthesized"))
        else:
            msg = f"rank {rank} died while running this test (no JUnit report)"
            cases.append((_case(test, "error", msg), suite_of(test), "synthesized"))
    return cases


def _read_report(path: Path, record: RankRecord | None) -> list[tuple[TestCase, str, str]]:
    xml = JUnitXml.fromfile(str(path))
    known = {}
    if record is not None:
        known = {mangle(n): n for n in (*record.collected, *(t.nodeid for t in record.tests))}
    cases = []
    for suite in xml:
        for case in suite:
            nodeid = known.get((case.classname or "", case.name or ""))
            name = suite_of(nodeid) if nodeid else suite_of_classname(case.classname or "")
            cases.append((TestCase.fromelem(deepcopy(case._elem)), name, "junit"))
    return cases


def merge_junit(out_dir: Path, ranks: RankFiles) -> MergedJUnit:
    """Build merged.xml from junit/rank-NN.xml, filling in ranks that left no report (or whose
    record says they wrote none)."""
    per_test: dict[tuple[str, str, str], list[tuple[int, TestCase, Case]]] = {}
    hosts: dict[int, str] = {}  # rank -> the digest of its host (never the name)
    missing: list[int] = []
    notes: list[str] = []
    for rank in range(ranks.world_size):
        record = ranks.records.get(rank)
        path = junit_path(out_dir, rank)
        if record is not None and record.extra.junit is False:
            # pytest's junitxml wrote this rank no report: whatever lies at its path was written
            # by something else (one made up from the record would drop the `ranks` limitation)
            missing.append(rank)
            if path.exists() or path.is_symlink():
                notes.append(
                    f"{path.relative_to(out_dir).as_posix()} is not rank {rank}'s: its record "
                    "says pytest's junitxml wrote it no report"
                )
            cases = _from_record(rank, record)
        else:
            try:
                cases = _read_report(path, record)
            except FileNotFoundError:
                missing.append(rank)
                cases = _from_record(rank, record)
            except (ET.ParseError, JUnitXmlError, OSError, ValueError) as exc:
                missing.append(rank)
                notes.append(f"{path.relative_to(out_dir).as_posix()} is unreadable: {exc}")
                cases = _from_record(rank, record)
        if record is not None and record.hostname:
            hosts[rank] = host_digest(record.hostname)
        for case, name, source in cases:
            outcome, message = _outcome(case)
            value = Case(
                rank, name, case.classname or "", case.name or "", outcome, message, source
            )
            per_test.setdefault((name, value.classname, value.name), []).append((rank, case, value))
    merged = JUnitXml("dcpqual")
    suites: dict[str, TestSuite] = {}
    for (suite_name, _, _), entries in per_test.items():
        if suite_name not in suites:
            suites[suite_name] = TestSuite(suite_name)
            merged.append(suites[suite_name])
        suites[suite_name].add_testcase(_one_case(suite_name, entries, hosts))
    for suite in suites.values():
        suite.update_statistics()
    merged.update_statistics()
    values = _in_rank_order(v for entries in per_test.values() for _, _, v in entries)
    return MergedJUnit(_serialize(merged), values, tuple(missing), tuple(notes))


def _in_rank_order(values: Iterable[Case]) -> tuple[Case, ...]:
    """Rank by rank, each rank's cases in test order (what `read_merged` gives back)."""
    return tuple(sorted(values, key=lambda c: c.rank))


def _one_case(
    suite: str, entries: list[tuple[int, TestCase, Case]], hosts: dict[int, str]
) -> TestCase:
    """One testcase for a test run on several ranks: the worst rank's (lowest first), with
    every rank's outcome, source, message and host digest as properties."""
    seen = {value.outcome for _, _, value in entries}
    worst = next(o for o in OUTCOME_ORDER if o in seen)
    _, shown, _ = next(e for e in entries if e[2].outcome == worst)
    case: TestCase = TestCase.fromelem(deepcopy(shown._elem))
    case.time = max((float(c.time or 0.0) for _, c, _ in entries), default=0.0)
    elem = case._elem
    found = elem.find("properties")
    props = Properties() if found is None else Properties.fromelem(found)
    props.add_property(Property(PROP_SUITE, suite))
    for rank, _, value in entries:
        props.add_property(Property(f"{PROP_RANK}.{rank:02d}", value.outcome))
        props.add_property(Property(f"{PROP_SOURCE}.{rank:02d}", value.source))
        if value.message:
            props.add_property(Property(f"{PROP_MESSAGE}.{rank:02d}", value.message))
        if rank in hosts:
            props.add_property(Property(f"{PROP_HOST}.{rank:02d}", hosts[rank]))
    if found is None:
        elem.insert(0, props._elem)
    for tag in ("system-out", "system-err"):  # each rank's own output is in its report
        for child in elem.findall(tag):
            elem.remove(child)
    return case


def _serialize(xml: JUnitXml) -> bytes:
    buf = io.BytesIO()
    xml.write(buf)
    tree = ET.ElementTree(ET.fromstring(buf.getvalue()))
    ET.indent(tree)
    out = io.BytesIO()
    tree.write(out, encoding="utf-8", xml_declaration=True)
    return out.getvalue() + b"\n"


def read_merged(path: Path) -> tuple[Case, ...]:
    """The cases of a merged.xml written by `merge_junit` (for `dcpqual verify`), one per
    (rank, test), as `merge_junit` gave them; older bundles' one-suite-per-rank form too.

    Raises ValueError when the file is not such a report.
    """
    try:
        xml = JUnitXml.fromfile(str(path))
    except (ET.ParseError, JUnitXmlError) as exc:
        raise ValueError(f"not valid JUnit XML: {exc}") from exc
    cases = []
    for suite in xml:
        for case in suite:
            cases += _rank_cases(case, suite.name)
    return _in_rank_order(cases)


def _per_rank(case: TestCase) -> dict[int, list[dict[str, str]]]:
    """Each rank's entries of a merged testcase, in order: a rank's report can hold one test
    twice (pytest writes a test that failed and then errored in teardown as two testcases),
    and `merge_junit` then writes that rank's outcome, source and message twice; each
    `dcpqual.rank.NN` starts an entry."""
    found = case._elem.find("properties")
    per_rank: dict[int, list[dict[str, str]]] = defaultdict(list)
    for prop in [] if found is None else Properties.fromelem(found):
        match = _PER_RANK.match(prop.name or "")
        if match is None:
            continue
        rank, kind = int(match[2]), match[1]
        if kind == "rank" or not per_rank[rank]:
            per_rank[rank].append({})
        per_rank[rank][-1][kind] = prop.value or ""
    return per_rank


def _rank_cases(case: TestCase, suite_name: str | None) -> list[Case]:
    props = _props(case)
    classname, name = case.classname or "", case.name or ""
    per_rank = _per_rank(case)
    if PROP_SUITE in props and per_rank:
        out = []
        for rank, said in ((r, e) for r, entries in sorted(per_rank.items()) for e in entries):
            if said.get("rank") not in OUTCOME_ORDER:
                raise ValueError(
                    f"testcase {classname}::{name} has rank {rank} without a known outcome"
                )
            out.append(
                Case(
                    rank,
                    props[PROP_SUITE],
                    classname,
                    name,
                    said["rank"],
                    said.get("message", ""),
                    said.get("source", "junit"),
                )
            )
        return out
    try:  # one suite per rank: the form of bundles written before
        rank = int(props[PROP_RANK])
        suite = props[PROP_SUITE]
    except (KeyError, ValueError):
        raise ValueError(
            f"testcase {classname}::{name} in {suite_name} has no "
            f"{PROP_RANK}/{PROP_SUITE} properties"
        ) from None
    outcome, message = _outcome(case)
    return [Case(rank, suite, classname, name, outcome, message, props.get(PROP_SOURCE, "junit"))]


def reader_problems(path: Path) -> list[str]:
    """Where merged.xml tells a test reporter something else than the per-rank outcomes verify
    counts (`read_merged`): a reporter reads each testcase's own result element and each
    suite's counts, so a failure element dropped (or a count zeroed) while the per-rank
    properties still say failed would show a failing run green. One line per problem; raises
    ValueError when the file is not such a report, as `read_merged` does."""
    try:
        xml = JUnitXml.fromfile(str(path))
    except (ET.ParseError, JUnitXmlError) as exc:
        raise ValueError(f"not valid JUnit XML: {exc}") from exc
    problems: list[str] = []
    total: dict[str, int] = defaultdict(int)
    for suite in xml:
        counts: dict[str, int] = defaultdict(int)
        for case in suite:
            shown, _ = _outcome(case)
            counts["tests"] += 1
            for result in case.result:  # as a reporter counts: each result element
                counts[_COUNTED.get(_outcome(_only(case, result))[0], "")] += 1
            said = {e.get("rank") for entries in _per_rank(case).values() for e in entries}
            worst = next((o for o in OUTCOME_ORDER if o in said), shown)
            if shown != worst:
                problems.append(
                    f"testcase {case.classname}::{case.name} shows {shown} where its ranks' "
                    f"outcomes make it {worst}"
                )
        for key in ("tests", "failures", "errors", "skipped"):
            total[key] += counts[key]
            if _count(suite, key) != counts[key]:
                problems.append(
                    f"testsuite {suite.name} says {key}={_count(suite, key)} where its "
                    f"testcases count {counts[key]}"
                )
    for key in ("tests", "failures", "errors", "skipped"):
        if _count(xml, key) != total[key]:
            problems.append(
                f"testsuites says {key}={_count(xml, key)} where its testcases count {total[key]}"
            )
    return problems


_COUNTED = {"failed": "failures", "error": "errors", "skipped": "skipped"}


def _only(case: TestCase, result: object) -> TestCase:
    """`case` with `result` as its only result element (to read that element's outcome)."""
    alone = TestCase(name=case.name, classname=case.classname)
    alone.result = [result]  # type: ignore[list-item]
    return alone


def _count(element: JUnitXml | TestSuite, key: str) -> int | None:
    """A suite's (or the report's) stated count; None where it is absent or not a number."""
    value = element._elem.get(key)
    return int(value) if value is not None and value.isdigit() else None


def skip_reason(message: str) -> str:
    """A skip's reason as a reader groups it: pytest's `Skipped: ` prefix and the
    `path:line: ` location it puts before a skip's text dropped, one line."""
    text = next(iter(message.strip().splitlines()), "").strip()
    text = text.removeprefix("Skipped: ")
    text = re.sub(r"^\S+\.py:\d+: ", "", text)
    return text or "no reason given"


def skip_reasons(cases: Iterable[Case]) -> dict[str, int]:
    """{reason: tests}: the tests a tally counts as skipped (skipped on every rank that ran
    them), grouped by their reason (the lowest rank's), most tests first."""
    seen: dict[tuple[str, str, str], dict[str, str]] = defaultdict(dict)
    for case in sorted(cases, key=lambda c: c.rank):
        seen[(case.suite, case.classname, case.name)].setdefault(case.outcome, case.message)
    counts: dict[str, int] = defaultdict(int)
    for outcomes in seen.values():
        if set(outcomes) == {"skipped"}:
            counts[skip_reason(outcomes["skipped"])] += 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def tallies(cases: Iterable[Case], *, runner_cases: bool = False) -> dict[str, Tally]:
    """Per-suite counts of tests (see the module docstring for the merge over ranks). The
    runner's own cases of ranks that left nothing are no tests; `runner_cases` counts them, as
    receipts written before `skip_reasons` did (under the suite `ranks`)."""
    outcomes: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    rank_cases: dict[str, int] = defaultdict(int)
    for case in cases:
        if case.suite == LIFECYCLE_SUITE and not runner_cases:
            continue  # the runner's own account of a rank that left nothing: not a test
        outcomes[(case.suite, case.classname, case.name)].add(case.outcome)
        rank_cases[case.suite] += 1
    counts: dict[str, dict[str, int]] = defaultdict(
        lambda: {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    )
    for (suite, _, _), seen in outcomes.items():
        outcome = next(o for o in OUTCOME_ORDER if o in seen)
        counts[suite]["errors" if outcome == "error" else outcome] += 1
    return {
        suite: Tally(**counts[suite], rank_cases=rank_cases[suite]) for suite in sorted(rank_cases)
    }
