"""The mutation report (`harness.qualify.mutants`): statuses parsed from mutmut's own output,
scored per file, equivalents excluded only when listed with a reason and the diff that was
judged, still produced with that diff and not killed, and the CLI's exits (0 at the minimum,
1 below it, 2 on bad input with nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.qualify import mutants
from harness.qualify.mutants import (
    Equivalent,
    MutantsError,
    diff_of,
    load_equivalents,
    parse_results,
    source_file,
    summarize,
)
from harness.schema.mutants import MutantsReportFile

RESULTS = """\
    harness.transport.combine.x_sanitize_lse__mutmut_1: killed
    harness.transport.combine.x_sanitize_lse__mutmut_2: survived
    harness.transport.combine.x_reference_max__mutmut_1: timeout
    harness.transport.combine.x_reference_max__mutmut_2: no tests
    harness.warm.warmup.x_warm__mutmut_1: killed
    harness.capture.detectors.xǁDynamoDetectorǁ_collect__mutmut_3: killed
    harness.capture.detectors.xǁDynamoDetectorǁ_collect__mutmut_4: skipped
    harness.models.cli.x_register__mutmut_1: not checked
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
    assert [f.path for f in report.not_run] == ["harness/models/cli.py"]  # not a 0 %
    assert by_path["harness/models/cli.py"].not_checked == 1
    partial = summarize(
        parse_results(RESULTS + "    harness.warm.warmup.x_warm__mutmut_2: not checked\n"), {}, {}
    )
    assert "harness/warm/warmup.py" in [f.path for f in partial.not_run]  # 1 of 2 run: no score
    assert report.score == pytest.approx(100.0 * 4 / 6)


SANITIZE_2 = "harness.transport.combine.x_sanitize_lse__mutmut_2"
DIFF = """\
--- harness/transport/combine.py
+++ harness/transport/combine.py
@@ -1,3 +1,3 @@
 def sanitize_lse(lse):
-    return torch.nan_to_num(lse, nan=-inf)
+    return torch.nan_to_num(lse, nan=None)"""


def _same_value(diff: str = DIFF) -> Equivalent:
    return Equivalent("same value", tuple(diff.splitlines()))


def test_listed_equivalents_leave_the_score_with_their_reason_and_diff() -> None:
    report = summarize(parse_results(RESULTS), {SANITIZE_2: _same_value()}, {SANITIZE_2: DIFF})
    combine = next(f for f in report.files if f.path == "harness/transport/combine.py")
    assert (combine.scored, combine.excluded) == (3, 1)
    assert SANITIZE_2 not in report.survivors
    entry = report.written(90.0).model_dump(mode="json")["excluded_equivalent"]
    path = "harness/transport/combine.py"
    assert entry == [{"mutant": SANITIZE_2, "file": path, "reason": "same value", "diff": DIFF}]


def test_a_stale_equivalent_is_an_error_not_a_silent_exclusion() -> None:
    gone = "harness.warm.warmup.x_gone__mutmut_9"
    with pytest.raises(MutantsError, match="stale list"):
        summarize(parse_results(RESULTS), {gone: _same_value()}, {})


def test_an_equivalent_whose_name_now_means_another_change_is_an_error() -> None:
    """After an edit mutmut renumbers a function's mutants: the listed name then points at
    another change, which must be judged on its own, not excluded under the old reason."""
    other = DIFF.replace("nan=None", "nan=0.0")
    with pytest.raises(MutantsError, match=r"diff is not the listed one.*sanitize_lse__mutmut_2"):
        summarize(parse_results(RESULTS), {SANITIZE_2: _same_value()}, {SANITIZE_2: other})
    with pytest.raises(MutantsError, match="diff is not the listed one"):
        summarize(parse_results(RESULTS), {SANITIZE_2: _same_value()}, {})  # no diff at all
    context = DIFF.replace(" def sanitize_lse(lse):", " def sanitize_lse(lse, base):")
    with pytest.raises(MutantsError, match="diff is not the listed one"):
        summarize(parse_results(RESULTS), {SANITIZE_2: _same_value()}, {SANITIZE_2: context})
    # Lines added above it in the function move the hunk; the change itself is the same one.
    moved = DIFF.replace("@@ -1,3 +1,3 @@", "@@ -4,3 +4,3 @@")
    report = summarize(parse_results(RESULTS), {SANITIZE_2: _same_value()}, {SANITIZE_2: moved})
    assert SANITIZE_2 in report.excluded


def test_an_equivalent_that_a_test_killed_is_an_error() -> None:
    killed = "harness.transport.combine.x_sanitize_lse__mutmut_1"
    with pytest.raises(MutantsError, match=r"killed by the tests.*sanitize_lse__mutmut_1"):
        summarize(parse_results(RESULTS), {killed: _same_value()}, {killed: DIFF})


def test_the_diff_leaves_out_mutmuts_status_header() -> None:
    assert diff_of(f"# {SANITIZE_2}: survived\n{DIFF}\n") == DIFF


def _entry(reason: object = "same value", diff: object = None) -> dict[str, object]:
    return {"reason": reason, "diff": DIFF.splitlines() if diff is None else diff}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (_entry(" "), "has no reason"),
        ("same value", "needs exactly 'reason' and 'diff'"),  # the format without diffs
        ({"reason": "same value"}, "needs exactly 'reason' and 'diff'"),
        ({**_entry(), "note": "x"}, "needs exactly 'reason' and 'diff'"),
        (_entry(diff=DIFF), "not a list of lines"),
        (_entry(diff=DIFF.splitlines()[:3]), "shows no change"),
    ],
)
def test_an_equivalent_needs_a_reason_and_the_diff_it_was_judged_on(
    tmp_path: Path, entry: object, message: str
) -> None:
    path = tmp_path / "eq.json"
    path.write_text(json.dumps({"equivalent": {SANITIZE_2: entry}}))
    with pytest.raises(MutantsError, match=message):
        load_equivalents(path)


def test_the_equivalents_file_must_be_a_table_of_entries(tmp_path: Path) -> None:
    path = tmp_path / "eq.json"
    path.write_text("[]")
    with pytest.raises(MutantsError, match="expected"):
        load_equivalents(path)
    path.write_text(json.dumps({"equivalent": {SANITIZE_2: _entry()}}))
    assert load_equivalents(path) == {SANITIZE_2: _same_value()}


TARGETS = """\
[project]
name = "x"

[tool.mutmut]
source_paths = ["harness"]
timeout_constant = 30.0

[tool.dcpqual-mutants.tests]
"harness/transport/combine.py" = ["tests/test_combine.py"]
"harness/warm/warmup.py" = ["tests/test_warmup.py"]
"harness/capture/detectors.py" = ["tests/test_capture_detectors.py"]
"harness/models/cli.py" = ["tests/test_signatures_cli.py"]
"""


def _fake_mutmut(
    monkeypatch: pytest.MonkeyPatch, results: str, shows: dict[str, str] | None = None
) -> list[Path]:
    """mutmut's `results` and `show` as a fake; returns the folders it was asked in."""
    asked: list[Path] = []

    def fake(*args: str, cwd: Path) -> str:
        asked.append(cwd)
        if args[0] == "results":
            return results
        return (shows or {}).get(args[1], f"--- diff of {args[1]}\n")

    monkeypatch.setattr(mutants, "_mutmut", fake)
    return asked


def _ran_before(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *paths: str) -> Path:
    """A checkout with the targets table whose listed files already have a mutmut run, in
    scratch copies made of this checkout as it is."""
    (tmp_path / "pyproject.toml").write_text(TARGETS)
    (tmp_path / "harness").mkdir(exist_ok=True)
    (tmp_path / "harness" / "m.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    for path in paths:
        _copied(tmp_path, path)
    return tmp_path


def _copied(root: Path, path: str) -> Path:
    """`path`'s scratch copy with a mutmut run in it, saying it was made of `root` as it is."""
    where = mutants.workdir(root / "mutants-work", path)
    (where / "mutants").mkdir(parents=True, exist_ok=True)
    narrowed = mutants.narrowed_pyproject(
        TARGETS, path, mutants.load_targets(root / "pyproject.toml")[path]
    )
    digest = mutants.sources_digest(root, narrowed)
    (where / mutants.SOURCES_FILE).write_text(json.dumps({"sha256": digest}))
    return where


def test_the_cli_writes_the_report_and_exits_by_the_minimum(monkeypatch, tmp_path, capsys):
    paths = ["harness/transport/combine.py", "harness/warm/warmup.py"]
    _ran_before(monkeypatch, tmp_path, *paths, "harness/capture/detectors.py")
    asked = _fake_mutmut(monkeypatch, RESULTS)
    out = tmp_path / "report.json"
    assert mutants.main(["--out", str(out), "--no-run"]) == 1
    report = json.loads(out.read_text())
    assert report["schema"] == "dcpqual-mutants/v1"
    assert report["below_min_score"] == ["harness/transport/combine.py"]
    assert report["survivors"][0]["diff"].startswith("--- diff of harness.transport.combine")
    assert "mutation score" in capsys.readouterr().out
    assert report["not_run"] == ["harness/models/cli.py"]
    # Each file's results and diffs come from that file's own scratch copy.
    assert Path("mutants-work/harness.transport.combine") in asked
    lower = tmp_path / "lower.json"
    assert mutants.main(["--out", str(lower), "--no-run", "--min-score", "50"]) == 1  # cli.py
    ran = RESULTS.replace("x_register__mutmut_1: not checked", "x_register__mutmut_1: killed")
    _fake_mutmut(monkeypatch, ran)
    _copied(tmp_path, "harness/models/cli.py")
    every = tmp_path / "every.json"
    assert mutants.main(["--out", str(every), "--no-run", "--min-score", "50"]) == 0


def test_a_listed_file_without_a_run_is_reported_not_run(monkeypatch, tmp_path):
    _ran_before(monkeypatch, tmp_path, "harness/transport/combine.py")
    _fake_mutmut(monkeypatch, RESULTS)
    out = tmp_path / "report.json"
    assert mutants.main(["--out", str(out), "--no-run", "--min-score", "40"]) == 1
    report = json.loads(out.read_text())
    # Only combine's own mutants are read from combine's copy, whatever else mutmut printed.
    assert [f["path"] for f in report["files"] if f["score"] is not None] == [
        "harness/transport/combine.py"
    ]
    assert sorted(report["not_run"]) == [
        "harness/capture/detectors.py",
        "harness/models/cli.py",
        "harness/warm/warmup.py",
    ]
    one = tmp_path / "one.json"
    args = ["--out", str(one), "--no-run", "--min-score", "40", "harness/transport/combine.py"]
    assert mutants.main(args) == 0
    assert [f["path"] for f in json.loads(one.read_text())["files"]] == [
        "harness/transport/combine.py"
    ]


def test_an_entry_from_the_cli_excludes_its_mutant_only_while_the_diff_holds(
    monkeypatch, tmp_path, capsys
):
    combine = "harness/transport/combine.py"
    _ran_before(monkeypatch, tmp_path, combine)
    _fake_mutmut(monkeypatch, RESULTS, {SANITIZE_2: f"# {SANITIZE_2}: survived\n{DIFF}\n"})
    assert mutants.main(["--entry", SANITIZE_2]) == 0
    entry = json.loads(capsys.readouterr().out)
    assert entry == {SANITIZE_2: {"reason": "", "diff": DIFF.splitlines()}}
    listed = tmp_path / "eq.json"
    listed.write_text(json.dumps({"equivalent": entry}))
    with pytest.raises(MutantsError, match="has no reason"):  # the reviewer must write one
        load_equivalents(listed)
    entry[SANITIZE_2]["reason"] = "same value"
    listed.write_text(json.dumps({"equivalent": entry}))
    args = ["--no-run", "--min-score", "60", "--equivalents", str(listed), combine]
    out = tmp_path / "report.json"
    assert mutants.main(["--out", str(out), *args]) == 0  # 2 of 3 once it is excluded
    assert [e["mutant"] for e in json.loads(out.read_text())["excluded_equivalent"]] == [SANITIZE_2]
    capsys.readouterr()
    renumbered = DIFF.replace("nan=None", "nan=0.0")
    _fake_mutmut(monkeypatch, RESULTS, {SANITIZE_2: f"# {SANITIZE_2}: survived\n{renumbered}"})
    again = tmp_path / "again.json"
    assert mutants.main(["--out", str(again), *args]) == 2
    assert not again.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "diff is not the listed one" in err[0] and SANITIZE_2 in err[0]


def test_the_cli_refuses_bad_input_and_writes_nothing(monkeypatch, tmp_path, capsys):
    _ran_before(monkeypatch, tmp_path, "harness/transport/combine.py")
    _fake_mutmut(monkeypatch, RESULTS)
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    assert mutants.main(["--out", str(existing), "--no-run"]) == 2
    assert existing.read_text() == "{}"
    _fake_mutmut(monkeypatch, "nothing here\n")
    fresh = tmp_path / "new.json"
    assert mutants.main(["--out", str(fresh), "--no-run"]) == 2
    _fake_mutmut(monkeypatch, RESULTS)
    assert mutants.main(["--out", str(fresh), "--no-run", "harness/warm/nope.py"]) == 2
    assert mutants.main(["--out", str(fresh), "--no-run", "--max-children", "0"]) == 2
    assert mutants.main(["--no-run"]) == 2  # no --out
    assert not fresh.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and all(line.startswith("mutants: ") for line in err)
    assert "nope.py" in err[2]


def test_the_targets_table_needs_tests_for_every_file(tmp_path):
    bad = tmp_path / "pyproject.toml"
    bad.write_text('[tool.dcpqual-mutants.tests]\n"harness/a.py" = []\n')
    with pytest.raises(MutantsError, match="non-empty list of tests"):
        mutants.load_targets(bad)
    bad.write_text("[tool.mutmut]\n")
    with pytest.raises(MutantsError, match=r"no \[tool.dcpqual-mutants.tests\]"):
        mutants.load_targets(bad)


def test_a_narrowed_pyproject_mutates_one_file_with_its_tests_and_keeps_the_rest() -> None:
    import tomllib

    text = mutants.narrowed_pyproject(TARGETS, "harness/warm/warmup.py", ["tests/test_warmup.py"])
    data = tomllib.loads(text)
    assert data["tool"]["mutmut"] == {
        "source_paths": ["harness"],
        "timeout_constant": 30.0,
        "only_mutate": ["harness/warm/warmup.py"],
        "pytest_add_cli_args_test_selection": ["tests/test_warmup.py"],
    }
    assert data["project"] == {"name": "x"}
    assert "harness/models/cli.py" in data["tool"]["dcpqual-mutants"]["tests"]


def test_a_run_starts_fresh_in_its_copy_with_one_openmp_thread(monkeypatch, tmp_path):
    """Forked runners inherit the parent's OpenMP pool and block on it: without one thread
    most torch mutants end as false "timeouts", which would count as kills."""
    root = tmp_path / "repo"
    (root / "harness").mkdir(parents=True)
    (root / "harness" / "m.py").write_text("x = 1\n")
    (root / "tests").mkdir()
    (root / "pyproject.toml").write_text(TARGETS)
    work = tmp_path / "work"
    stale = mutants.workdir(work, "harness/m.py") / "mutants" / "old"
    stale.parent.mkdir(parents=True)
    stale.write_text("a previous run")
    seen: dict[str, object] = {}

    class FakePopen:
        def __init__(self, command, *, cwd, env, start_new_session):
            seen.update(command=command, cwd=cwd, env=env)
            self.pid = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(mutants.subprocess, "Popen", FakePopen)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert mutants.run_target(root, work, "harness/m.py", ["tests/t.py"], children=2, limit=9)
    copy = mutants.workdir(work, "harness/m.py")
    assert seen["cwd"] == copy and not stale.exists()
    assert seen["env"]["OMP_NUM_THREADS"] == "1" and seen["env"]["MKL_NUM_THREADS"] == "1"
    assert seen["command"][-3:] == ["run", "--max-children", "2"]
    assert (copy / "harness" / "m.py").read_text() == "x = 1\n"
    narrowed = (copy / "pyproject.toml").read_text()
    assert "harness/m.py" in narrowed
    recorded = json.loads((copy / mutants.SOURCES_FILE).read_text())["sha256"]
    assert recorded == mutants.sources_digest(root, narrowed)


def test_a_report_names_what_each_files_run_mutated_and_tested(monkeypatch, tmp_path):
    combine = "harness/transport/combine.py"
    _ran_before(monkeypatch, tmp_path, combine)
    _fake_mutmut(monkeypatch, RESULTS)
    out = tmp_path / "report.json"
    mutants.main(["--out", str(out), "--no-run", "--min-score", "40", combine])
    (row,) = json.loads(out.read_text())["files"]
    narrowed = mutants.narrowed_pyproject(TARGETS, combine, ["tests/test_combine.py"])
    assert row["sources_sha256"] == mutants.sources_digest(tmp_path, narrowed)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda root: (root / "harness" / "m.py").write_text("x = 2\n"), id="source"),
        pytest.param(
            lambda root: (root / "tests").mkdir() or (root / "tests" / "t.py").touch(),
            id="new-test",
        ),
        pytest.param(
            lambda root: (root / "pyproject.toml").write_text(
                TARGETS.replace('["tests/test_combine.py"]', '["tests/test_other.py"]')
            ),
            id="its-tests",
        ),
        pytest.param(
            lambda root: (
                root / "mutants-work" / "harness.transport.combine" / mutants.SOURCES_FILE
            ).unlink(),
            id="unrecorded",
        ),
    ],
)
def test_results_of_a_copy_made_of_other_sources_are_never_reported(
    monkeypatch, tmp_path, capsys, change
):
    """A score measured on one checkout must not be written as another's: `--no-run` reads
    whatever the scratch copies hold, so each copy's sources are held to the checkout's."""
    combine = "harness/transport/combine.py"
    _ran_before(monkeypatch, tmp_path, combine)
    _fake_mutmut(monkeypatch, RESULTS)
    change(tmp_path)
    out = tmp_path / "report.json"
    assert mutants.main(["--out", str(out), "--no-run", "--min-score", "40", combine]) == 2
    assert not out.exists()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "harness.transport.combine" in line and "run it again without --no-run" in line


def test_edited_docs_and_equivalents_keep_a_copys_sources(monkeypatch, tmp_path):
    """What is edited after a run (the report, its table, the equivalents list) decides no
    mutant's outcome, so a `--no-run` report after those edits still reads the copy."""
    combine = "harness/transport/combine.py"
    _ran_before(monkeypatch, tmp_path, combine)
    _fake_mutmut(monkeypatch, RESULTS)
    (tmp_path / "tests").mkdir()
    for name in ("README.md", "mutants-report.json", "mutants-equivalent.json"):
        (tmp_path / "tests" / name).write_text("edited after the run")
    out = tmp_path / "report.json"
    assert mutants.main(["--out", str(out), "--no-run", "--min-score", "40", combine]) == 0


def test_the_committed_equivalents_file_is_valid() -> None:
    path = Path(__file__).resolve().parent / "mutants-equivalent.json"
    load_equivalents(path)


def test_the_module_runs_as_a_command(tmp_path: Path) -> None:
    """`nox -s mutants` runs `python -m harness.qualify.mutants`: bad input there is one line
    and exit 2 (here: no targets table in this folder's pyproject)."""
    import subprocess
    import sys

    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    done = subprocess.run(
        [sys.executable, "-m", "harness.qualify.mutants", "--out", "r.json", "--no-run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and not (tmp_path / "r.json").exists()
    assert done.stderr.strip().splitlines() == [
        f"mutants: {tmp_path / 'pyproject.toml'}: no [tool.dcpqual-mutants.tests] table"
    ]


def test_the_committed_report_is_the_models_own_text(repo_root: Path) -> None:
    """The report file reads as its model and is written back byte for byte, so what the
    model describes (and the committed schema says) is exactly the file's format."""
    text = (repo_root / "tests" / "mutants-report.json").read_text()
    report = MutantsReportFile.model_validate_json(text)
    assert report.text() == text
    assert report.excluded_equivalent and all(e.reason for e in report.excluded_equivalent)
    with pytest.raises(ValueError, match="surprise"):
        MutantsReportFile.model_validate({**json.loads(text), "surprise": 1})


def test_a_written_report_escapes_mutmuts_method_names_as_before() -> None:
    text = summarize(parse_results(RESULTS), {}, {}).written(90.0).text()
    assert "x\\u01c1DynamoDetector\\u01c1_collect__mutmut_4" in text and "ǁ" not in text
