"""The mutation report (`harness.qualify.mutants`): statuses parsed from mutmut's own output,
scored per file, equivalents excluded only when listed with a reason and still produced, and
the CLI's exits (0 at the minimum, 1 below it, 2 on bad input with nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.qualify import mutants
from harness.qualify.mutants import (
    MutantsError,
    load_equivalents,
    parse_results,
    source_file,
    summarize,
)

RESULTS = """\
    harness.transport.combine.x_sanitize_lse__mutmut_1: killed
    harness.transport.combine.x_sanitize_lse__mutmut_2: survived
    harness.transport.combine.x_reference_max__mutmut_1: timeout
    harness.transport.combine.x_reference_max__mutmut_2: no tests
    harness.warm.warmup.x_warm__mutmut_1: killed
    harness.capture.detectors.xǁDynamoDetectorǁ_collect__mutmut_3: killed
    harness.capture.detectors.xǁDynamoDetectorǁ_collect__mutmut_4: skipped
    harness.warm.cli.x_register__mutmut_1: not checked
"""


def test_results_lines_become_statuses() -> None:
    statuses = parse_results("header line\n" + RESULTS)
    assert len(statuses) == 8
    assert statuses["harness.transport.combine.x_sanitize_lse__mutmut_2"] == "survived"
    assert statuses["harness.transport.combine.x_reference_max__mutmut_2"] == "no tests"


def test_mutant_names_map_to_their_source_files() -> None:
    assert source_file("harness.warm.warmup.x_warm__mutmut_3") == "harness/warm/warmup.py"
    method = "harness.capture.detectors.xǁDynamoDetectorǁ_collect__mutmut_1"
    assert source_file(method) == "harness/capture/detectors.py"
    with pytest.raises(MutantsError, match="not a mutmut 3 mutant name"):
        source_file("x_warm__mutmut_3")


def test_scores_count_timeouts_as_kills_and_uncovered_as_survivors() -> None:
    report = summarize(parse_results(RESULTS), {}, {})
    by_path = {f.path: f for f in report.files}
    combine = by_path["harness/transport/combine.py"]
    assert (combine.killed, combine.scored, combine.score) == (2, 4, 50.0)
    assert by_path["harness/warm/warmup.py"].score == 100.0
    assert by_path["harness/capture/detectors.py"].scored == 1  # skipped is listed, not scored
    assert report.skipped == ("harness.capture.detectors.xǁDynamoDetectorǁ_collect__mutmut_4",)
    assert set(report.survivors) == {
        "harness.transport.combine.x_sanitize_lse__mutmut_2",
        "harness.transport.combine.x_reference_max__mutmut_2",
    }
    assert [f.path for f in report.below(90.0)] == ["harness/transport/combine.py"]
    assert [f.path for f in report.not_run] == ["harness/warm/cli.py"]  # not a 0 %
    assert by_path["harness/warm/cli.py"].not_checked == 1
    partial = summarize(
        parse_results(RESULTS + "    harness.warm.warmup.x_warm__mutmut_2: not checked\n"), {}, {}
    )
    assert "harness/warm/warmup.py" in [f.path for f in partial.not_run]  # 1 of 2 run: no score
    assert report.score == pytest.approx(100.0 * 4 / 6)


def test_listed_equivalents_leave_the_score_with_their_reason() -> None:
    name = "harness.transport.combine.x_sanitize_lse__mutmut_2"
    report = summarize(parse_results(RESULTS), {name: "same value"}, {})
    combine = next(f for f in report.files if f.path == "harness/transport/combine.py")
    assert (combine.scored, combine.excluded) == (3, 1)
    assert name not in report.survivors
    entry = report.to_json(90.0)["excluded_equivalent"]
    path = "harness/transport/combine.py"
    assert entry == [{"mutant": name, "file": path, "reason": "same value"}]


def test_a_stale_equivalent_is_an_error_not_a_silent_exclusion() -> None:
    with pytest.raises(MutantsError, match="stale list"):
        summarize(parse_results(RESULTS), {"harness.warm.warmup.x_gone__mutmut_9": "old"}, {})


def test_an_equivalent_needs_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "eq.json"
    path.write_text(json.dumps({"equivalent": {"harness.warm.warmup.x_warm__mutmut_1": " "}}))
    with pytest.raises(MutantsError, match="has no reason"):
        load_equivalents(path)
    path.write_text("[]")
    with pytest.raises(MutantsError, match="expected"):
        load_equivalents(path)


def _fake_mutmut(monkeypatch: pytest.MonkeyPatch, results: str) -> None:
    def fake(*args: str) -> str:
        if args[0] == "results":
            return results
        return f"--- diff of {args[1]}\n"

    monkeypatch.setattr(mutants, "_mutmut", fake)


def test_the_cli_writes_the_report_and_exits_by_the_minimum(monkeypatch, tmp_path, capsys):
    _fake_mutmut(monkeypatch, RESULTS)
    out = tmp_path / "report.json"
    assert mutants.main(["--out", str(out), "--no-run"]) == 1
    report = json.loads(out.read_text())
    assert report["schema"] == "dcpqual-mutants/v1"
    assert report["below_min_score"] == ["harness/transport/combine.py"]
    assert report["survivors"][0]["diff"].startswith("--- diff of harness.transport.combine")
    assert "mutation score" in capsys.readouterr().out
    assert report["not_run"] == ["harness/warm/cli.py"]
    lower = tmp_path / "lower.json"
    assert mutants.main(["--out", str(lower), "--no-run", "--min-score", "50"]) == 1  # cli.py
    ran = RESULTS.replace("x_register__mutmut_1: not checked", "x_register__mutmut_1: killed")
    _fake_mutmut(monkeypatch, ran)
    every = tmp_path / "every.json"
    assert mutants.main(["--out", str(every), "--no-run", "--min-score", "50"]) == 0


def test_the_cli_refuses_bad_input_and_writes_nothing(monkeypatch, tmp_path, capsys):
    _fake_mutmut(monkeypatch, RESULTS)
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    assert mutants.main(["--out", str(existing), "--no-run"]) == 2
    assert existing.read_text() == "{}"
    _fake_mutmut(monkeypatch, "nothing here\n")
    fresh = tmp_path / "new.json"
    assert mutants.main(["--out", str(fresh), "--no-run"]) == 2
    assert not fresh.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("mutants: ") for line in err)


def test_the_committed_equivalents_file_is_valid() -> None:
    path = Path(__file__).resolve().parent / "mutants-equivalent.json"
    load_equivalents(path)
