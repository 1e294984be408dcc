"""Merge the per-rank JUnit reports into `junit/merged.xml` and count outcomes per suite.

`merged.xml` holds one `<testsuite name="rank-NN">` per expected rank; every testcase carries the
properties `dcpqual.rank`, `dcpqual.suite` and `dcpqual.source` (`junit` when copied from the
rank's own report, `record` when rebuilt from its rank record because the report is missing,
`synthesized` for the error case that attributes a dead rank, as xdist does for a dead worker).

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
from harness.evidence.schema import Tally
from harness.schema.rank_record import RankRecord, junit_path, suite_of

PROP_RANK = "dcpqual.rank"
PROP_SUITE = "dcpqual.suite"
PROP_SOURCE = "dcpqual.source"
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


def _tag(case: TestCase, rank: int, suite: str, source: str) -> TestCase:
    elem = case._elem
    found = elem.find("properties")
    props = Properties() if found is None else Properties.fromelem(found)
    for name, value in ((PROP_RANK, str(rank)), (PROP_SUITE, suite), (PROP_SOURCE, source)):
        props.add_property(Property(name, value))
    if found is None:
        elem.insert(0, props._elem)
    return case


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
    """Build merged.xml from junit/rank-NN.xml, filling in ranks that left no report."""
    merged = JUnitXml("dcpqual")
    values: list[Case] = []
    missing: list[int] = []
    notes: list[str] = []
    for rank in range(ranks.world_size):
        record = ranks.records.get(rank)
        path = junit_path(out_dir, rank)
        try:
            cases = _read_report(path, record)
        except FileNotFoundError:
            missing.append(rank)
            cases = _from_record(rank, record)
        except (ET.ParseError, JUnitXmlError, OSError, ValueError) as exc:
            missing.append(rank)
            notes.append(f"{path.relative_to(out_dir).as_posix()} is unreadable: {exc}")
            cases = _from_record(rank, record)
        suite = TestSuite(f"rank-{rank:02d}")
        suite.add_property("dcpqual.rank", str(rank))
        if record is not None and record.hostname:
            suite.add_property("dcpqual.host", host_digest(record.hostname))
        tagged = [_tag(case, rank, name, source) for case, name, source in cases]
        suite.add_testcases(tagged)
        merged.append(suite)
        for case, (_, name, source) in zip(tagged, cases, strict=True):
            outcome, message = _outcome(case)
            values.append(
                Case(rank, name, case.classname or "", case.name or "", outcome, message, source)
            )
    merged.update_statistics()
    return MergedJUnit(_serialize(merged), tuple(values), tuple(missing), tuple(notes))


def _serialize(xml: JUnitXml) -> bytes:
    buf = io.BytesIO()
    xml.write(buf)
    tree = ET.ElementTree(ET.fromstring(buf.getvalue()))
    ET.indent(tree)
    out = io.BytesIO()
    tree.write(out, encoding="utf-8", xml_declaration=True)
    return out.getvalue() + b"\n"


def read_merged(path: Path) -> tuple[Case, ...]:
    """The cases of a merged.xml written by `merge_junit` (for `dcpqual verify`).

    Raises ValueError when the file is not such a report.
    """
    try:
        xml = JUnitXml.fromfile(str(path))
    except (ET.ParseError, JUnitXmlError) as exc:
        raise ValueError(f"not valid JUnit XML: {exc}") from exc
    cases = []
    for suite in xml:
        for case in suite:
            props = _props(case)
            try:
                rank = int(props[PROP_RANK])
                name = props[PROP_SUITE]
            except (KeyError, ValueError):
                raise ValueError(
                    f"testcase {case.classname}::{case.name} in {suite.name} has no "
                    f"{PROP_RANK}/{PROP_SUITE} properties"
                ) from None
            outcome, message = _outcome(case)
            cases.append(
                Case(
                    rank,
                    name,
                    case.classname or "",
                    case.name or "",
                    outcome,
                    message,
                    props.get(PROP_SOURCE, "junit"),
                )
            )
    return tuple(cases)


def tallies(cases: Iterable[Case]) -> dict[str, Tally]:
    """Per-suite counts of tests (see the module docstring for the merge over ranks)."""
    outcomes: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    rank_cases: dict[str, int] = defaultdict(int)
    for case in cases:
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
