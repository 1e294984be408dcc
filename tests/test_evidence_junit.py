"""Merging per-rank JUnit reports and counting tests per suite."""

from __future__ import annotations

from pathlib import Path

import pytest
from _support.evidence_factory import (
    COMBINE_TEST,
    NODES,
    failed,
    junit_xml,
    passed,
    write_rank,
)

from harness.evidence.collect import load_records
from harness.evidence.junit import (
    Case,
    mangle,
    merge_junit,
    read_merged,
    suite_of_classname,
    tallies,
)
from harness.schema.rank_record import suite_of


@pytest.mark.parametrize(
    "nodeid, expected",
    [
        ("suites/capture/test_x.py::test_y", ("suites.capture.test_x", "test_y")),
        ("suites/a/test_x.py::TestC::test_y[p::q-1]", ("suites.a.test_x.TestC", "test_y[p::q-1]")),
        ("test_top.py::test_z", ("test_top", "test_z")),
    ],
)
def test_mangle_matches_pytest_junitxml(nodeid: str, expected: tuple[str, str]) -> None:
    assert mangle(nodeid) == expected


@pytest.mark.parametrize("nodeid", [*NODES, "tests/test_a.py::TestB::test_c", "test_top.py::t"])
def test_suite_of_classname_agrees_with_suite_of(nodeid: str) -> None:
    assert suite_of_classname(mangle(nodeid)[0]) == suite_of(nodeid)


def case(rank: int, outcome: str, name: str = "t", suite: str = "s") -> Case:
    return Case(rank, suite, "suites.s.test_m", name, outcome, "", "junit")


def test_tallies_count_tests_once_with_the_worst_outcome_over_ranks() -> None:
    cases = [
        case(0, "passed", "a"),
        case(1, "passed", "a"),
        case(0, "passed", "b"),
        case(1, "failed", "b"),
        case(0, "error", "c"),
        case(1, "failed", "c"),
        case(0, "skipped", "d"),
        case(1, "passed", "d"),
        case(0, "skipped", "e"),
        case(0, "error", "f", suite="other"),
    ]
    counts = tallies(cases)
    assert counts["s"].model_dump() == {
        "passed": 2,
        "failed": 2,
        "skipped": 1,
        "errors": 0,
        "rank_cases": 9,
    }
    assert (counts["other"].errors, counts["other"].rank_cases) == (1, 1)


def test_merge_tags_every_case_with_its_rank_and_suite(tmp_path: Path) -> None:
    tests = [passed(n) for n in NODES]
    tests[1] = failed(COMBINE_TEST, "boom <&>")
    for rank in range(2):
        write_rank(tmp_path, rank, 2, tests=tests)
    merged = merge_junit(tmp_path, load_records(tmp_path, 2))
    (tmp_path / "merged.xml").write_bytes(merged.xml)

    cases = read_merged(tmp_path / "merged.xml")
    assert cases == merged.cases
    assert [c.rank for c in cases] == [0] * 4 + [1] * 4
    assert {c.suite for c in cases} == {"warm", "transport", "capture"}
    bad = [c for c in cases if c.outcome == "failed"]
    assert [(c.rank, c.classname, c.message) for c in bad] == [
        (0, "suites.transport.test_combine.TestCombine", "boom <&>"),
        (1, "suites.transport.test_combine.TestCombine", "boom <&>"),
    ]
    assert merged.failures()[0][:2] == (
        0,
        "suites.transport.test_combine.TestCombine::test_matches_reference",
    )
    text = merged.xml.decode()
    assert 'name="dcpqual.source.01" value="junit"' in text
    assert 'name="dcpqual.rank.00" value="failed"' in text


def test_merged_has_one_testcase_per_test_so_reporters_count_tests(tmp_path: Path) -> None:
    """4 tests on 2 ranks: a CI reporter reading merged.xml sees 4 testcases, 1 failure."""
    import xml.etree.ElementTree as ET

    tests = [passed(n) for n in NODES]
    for rank in range(2):
        mine = list(tests)
        if rank == 1:
            mine[1] = failed(COMBINE_TEST, "only rank 1")
        write_rank(tmp_path, rank, 2, tests=mine)
    merged = merge_junit(tmp_path, load_records(tmp_path, 2))
    root = ET.fromstring(merged.xml)
    testcases = root.findall(".//testcase")
    names = [(c.get("classname"), c.get("name")) for c in testcases]
    assert len(names) == len(set(names)) == len(NODES)
    assert (root.get("tests"), root.get("failures")) == ("4", "1")
    [bad] = [c for c in testcases if c.find("failure") is not None]
    outcomes = {p.get("name"): p.get("value") for p in bad.iter("property")}
    assert outcomes["dcpqual.rank.00"] == "passed" and outcomes["dcpqual.rank.01"] == "failed"
    assert outcomes["dcpqual.message.01"] == "only rank 1"


def test_merge_keeps_properties_pytest_already_wrote(tmp_path: Path) -> None:
    (tmp_path / "junit").mkdir()
    xml = junit_xml([passed(NODES[0])]).replace(
        'time="0.25" />',
        'time="0.25"><properties><property name="seed" value="7" /></properties></testcase>',
    )
    (tmp_path / "junit" / "rank-00.xml").write_text(xml)
    merged = merge_junit(tmp_path, load_records(tmp_path, 1))
    text = merged.xml.decode()
    assert text.count("<properties>") == 1  # the case's, shared with the ranks' outcomes
    assert 'name="seed" value="7"' in text and 'name="dcpqual.rank.00" value="passed"' in text


def test_missing_report_is_rebuilt_from_the_record(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, 2)
    write_rank(tmp_path, 1, 2, junit=False)
    merged = merge_junit(tmp_path, load_records(tmp_path, 2))
    assert merged.missing == (1,)
    from_record = [c for c in merged.cases if c.rank == 1]
    assert {c.source for c in from_record} == {"record"}
    assert len(from_record) == len(NODES)
    assert tallies(merged.cases)["capture"].passed == 2


def test_rank_that_left_nothing_gets_one_error_case(tmp_path: Path) -> None:
    write_rank(tmp_path, 0, 2)
    merged = merge_junit(tmp_path, load_records(tmp_path, 2))
    [dead] = [c for c in merged.cases if c.rank == 1]
    assert (dead.suite, dead.name, dead.outcome, dead.source) == (
        "ranks",
        "rank_01_started",
        "error",
        "synthesized",
    )


def test_read_merged_rejects_reports_without_rank_tags(tmp_path: Path) -> None:
    path = tmp_path / "merged.xml"
    path.write_text(junit_xml([passed(NODES[0])]))
    with pytest.raises(ValueError, match=r"no dcpqual\.rank/dcpqual\.suite properties"):
        read_merged(path)
    path.write_text("<testsuites><testsuite>")
    with pytest.raises(ValueError, match="not valid JUnit XML"):
        read_merged(path)


def test_read_merged_still_reads_the_one_suite_per_rank_form(tmp_path: Path) -> None:
    """Bundles written before one testcase per test still verify."""
    path = tmp_path / "merged.xml"
    path.write_text(
        '<testsuites name="dcpqual"><testsuite name="rank-01">'
        '<testcase classname="suites.capture.test_x" name="t"><properties>'
        '<property name="dcpqual.rank" value="1" />'
        '<property name="dcpqual.suite" value="capture" />'
        '<property name="dcpqual.source" value="record" /></properties>'
        '<skipped message="needs 16 ranks" /></testcase></testsuite></testsuites>'
    )
    assert read_merged(path) == (
        Case(1, "capture", "suites.capture.test_x", "t", "skipped", "needs 16 ranks", "record"),
    )
