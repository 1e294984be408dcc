"""`dcpqual verify`: tamper detection over every file of a bundle, truncation, consistency
checks, and exit codes through the real CLI."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import (
    DENIALS,
    NODES,
    context,
    failing_run,
    gpu_run,
    killed_run,
    passed,
    passing_run,
    timed_out_run,
    write_rank,
)
from _support.forge import forge, restate_limitations
from _support.forge import reseal as forge_reseal
from _support.locked import hold_to_modes, lock

from harness.cli import main
from harness.evidence import derive, verify
from harness.evidence.files import render_sums, sha256_bytes, sha256_file
from harness.evidence.rederive import first_difference
from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle
from harness.schema.receipt import Receipt

REPO = Path(__file__).resolve().parent.parent
# Every file a 2-rank passing bundle holds; a test below keeps this list honest.
BUNDLE_FILES = (
    "SHA256SUMS",
    "junit/merged.xml",
    "junit/rank-00.xml",
    "junit/rank-01.xml",
    "launch.json",
    "receipt.json",
    "records/rank-00.json",
    "records/rank-01.json",
    "summary.md",
    "torchrun/run-1/attempt_0/0/stdout.log",
    "torchrun/run-1/attempt_0/1/stdout.log",
)
WHERE = ("first", "middle", "last")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pristine") / "bundle"
    finalize_bundle(out, passing_run(out, world=2))
    return out


@pytest.fixture
def bundle(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(pristine, copy)
    return copy


def flip(path: Path, where: str) -> None:
    data = bytearray(path.read_bytes())
    index = {"first": 0, "middle": len(data) // 2, "last": len(data) - 1}[where]
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


def reseal(bundle: Path) -> None:
    """Re-hash after an edit of receipt.json, as a forger would: only consistency can catch it.
    A receipt that still validates gets the summary it renders; one that does not (the schema
    tests) only gets its hash in summary.md replaced."""
    receipt = (bundle / "receipt.json").read_bytes()
    try:
        Receipt.model_validate_json(receipt)
    except ValueError:
        pass
    else:
        return forge_reseal(bundle)
    summary = bundle / "summary.md"
    lines = summary.read_text().splitlines(keepends=True)
    summary.write_text(
        "".join(
            f"receipt.json sha256: `{sha256_bytes(receipt)}`\n"
            if line.startswith("receipt.json sha256:")
            else line
            for line in lines
        )
    )
    files = sorted(
        p.relative_to(bundle).as_posix()
        for p in bundle.rglob("*")
        if p.is_file() and p.name != "SHA256SUMS"
    )
    sums = {rel: sha256_file(bundle / rel) for rel in files}
    (bundle / "SHA256SUMS").write_text(render_sums(sums))


def edit_receipt(bundle: Path, change) -> None:
    data = json.loads((bundle / "receipt.json").read_text())
    change(data)
    (bundle / "receipt.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    reseal(bundle)


def test_pristine_bundle_is_valid(pristine: Path) -> None:
    result = verify_bundle(pristine)
    assert result.ok, result.problems


def test_bundle_files_list_is_complete(pristine: Path) -> None:
    found = sorted(p.relative_to(pristine).as_posix() for p in pristine.rglob("*") if p.is_file())
    assert tuple(found) == BUNDLE_FILES


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("rel", BUNDLE_FILES)
def test_editing_any_byte_of_any_file_is_caught_and_named(bundle: Path, rel: str, where: str):
    flip(bundle / rel, where)
    result = verify_bundle(bundle)
    assert not result.ok
    assert any(rel in problem for problem in result.problems), result.problems


@pytest.mark.parametrize(
    "rel", [r for r in BUNDLE_FILES if r not in ("SHA256SUMS", "summary.md", "receipt.json")]
)
def test_an_edited_file_is_blamed_not_sha256sums(bundle: Path, rel: str) -> None:
    flip(bundle / rel, "middle")
    problems = verify_bundle(bundle).problems
    assert any(p.startswith(f"{rel}: modified") for p in problems), problems
    assert not any(p.startswith("SHA256SUMS") for p in problems), problems


@pytest.mark.parametrize("rel", ["records/rank-01.json", "junit/merged.xml", "receipt.json"])
def test_an_edited_sha256sums_line_is_blamed_on_sha256sums(bundle: Path, rel: str) -> None:
    sums = bundle / "SHA256SUMS"
    lines = sums.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.endswith(f"  {rel}\n"))
    digit = lines[index][10]
    lines[index] = lines[index][:10] + ("0" if digit != "0" else "1") + lines[index][11:]
    sums.write_text("".join(lines))
    problems = verify_bundle(bundle).problems
    assert problems and all(p.startswith("SHA256SUMS: ") for p in problems), problems
    assert rel in problems[0]


def test_missing_extra_and_truncated_files_are_named(bundle: Path) -> None:
    (bundle / "records" / "rank-01.json").unlink()
    (bundle / "torchrun" / "late.log").write_text("written after the bundle\n")
    problems = verify_bundle(bundle).problems
    assert "records/rank-01.json: missing" in problems
    assert any(p.startswith("torchrun/late.log: not listed in SHA256SUMS") for p in problems)


def test_truncated_bundle_names_every_required_file(bundle: Path) -> None:
    for name in ("receipt.json", "summary.md", "SHA256SUMS"):
        (bundle / name).unlink()
    problems = verify_bundle(bundle).problems
    for name in ("receipt.json", "summary.md", "SHA256SUMS"):
        assert f"{name}: missing" in problems


def test_truncated_file_is_named(bundle: Path) -> None:
    path = bundle / "junit" / "merged.xml"
    path.write_bytes(path.read_bytes()[:100])
    problems = verify_bundle(bundle).problems
    assert any(p.startswith("junit/merged.xml: modified") for p in problems)
    assert any(p.startswith("junit/merged.xml: not valid JUnit XML") for p in problems)


def test_link_in_bundle_is_a_problem(bundle: Path) -> None:
    (bundle / "torchrun" / "link.log").symlink_to(bundle / "summary.md")
    problems = verify_bundle(bundle).problems
    assert "torchrun/link.log: is a symlink, not a file" in problems


def test_a_linked_stacks_folder_is_named_and_not_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verify derives the root cause, stack dump and all, from a bundle it cannot trust."""
    out = tmp_path / "bundle"
    finalize_bundle(out, timed_out_run(out))
    elsewhere = tmp_path / "elsewhere"
    (out / "stacks").rename(elsewhere)
    (out / "stacks").symlink_to(elsewhere, target_is_directory=True)
    walked: list[Path] = []
    monkeypatch.setattr(derive, "walk", lambda root: walked.append(root) or iter(()))
    problems = verify_bundle(out).problems
    assert "stacks: is a symlink, not a file" in problems
    assert walked == []


def test_schema_violation_is_reported_per_field(bundle: Path) -> None:
    def change(data: dict) -> None:
        data["verdict"] = "maybe"
        data["geometry"]["dcp"] = 3
        data["surprise"] = 1

    edit_receipt(bundle, change)
    problems = verify_bundle(bundle).problems
    assert any(p.startswith("receipt.json: schema: verdict:") for p in problems), problems
    assert any(p.startswith("receipt.json: schema: geometry:") for p in problems), problems
    assert any(p.startswith("receipt.json: schema: surprise:") for p in problems), problems


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("run.exit_code", False, "a JSON boolean where the receipt holds a number"),
        ("run.exit_code", "0", "a JSON string where the receipt holds a number"),
        ("ranks.expected", "2", "a JSON string where the receipt holds a number"),
        ("run.timed_out", 0, "a JSON number where the receipt holds a boolean"),
    ],
    ids=["false-for-0", "string-for-0", "string-for-2", "0-for-false"],
)
def test_a_value_of_another_json_type_is_refused(
    bundle: Path, where: str, value: object, message: str
) -> None:
    """pydantic reads each as the writer's value (`false` as 0, "0" as 0, "2" as 2, 0 as
    false), so every other check is satisfied; a reader of the JSON is not (jq's `.failed > 0`
    is false for a count of `true`)."""
    *parents, name = where.split(".")

    def change(data: dict) -> None:
        for key in parents:
            data = data[key]
        data[name] = value

    edit_receipt(bundle, change)
    assert verify_bundle(bundle).problems == (f"receipt.json: schema: {where}: {message}",)


def test_a_rank_file_of_no_rank_of_the_world_is_refused(bundle: Path) -> None:
    """The derivation reads only the world's `records/rank-NN.json` and `junit/rank-NN.xml`: a
    third rank's record and report in a 2-rank bundle (all passed, say), or a report named
    otherwise than the ranks name theirs, would be evidence nothing holds, and a test reporter
    that reads junit/rank-*.xml would count it."""
    copies = {
        "records/rank-02.json": "records/rank-01.json",
        "junit/rank-02.xml": "junit/rank-01.xml",
        "junit/rank-1.xml": "junit/rank-01.xml",
    }
    for name, source in copies.items():
        shutil.copyfile(bundle / source, bundle / name)
    edit_receipt(bundle, lambda d: d["files"].update({n: sha256_file(bundle / n) for n in copies}))
    assert verify_bundle(bundle).problems == (
        "records/rank-02.json: not the file of a rank of this 2-rank run (its ranks' are "
        "rank-00.json to rank-01.json)",
        "junit/rank-02.xml: not the file of a rank of this 2-rank run (its ranks' are "
        "rank-00.xml to rank-01.xml)",
        "junit/rank-1.xml: not the file of a rank of this 2-rank run (its ranks' are "
        "rank-00.xml to rank-01.xml)",
    )


def test_wrong_schema_version_is_reported(bundle: Path) -> None:
    edit_receipt(bundle, lambda d: d.update(schema="dcpqual-receipt/v0"))
    assert verify_bundle(bundle).problems == (
        "receipt.json: schema is 'dcpqual-receipt/v0', expected 'dcpqual-receipt/v1'",
    )


def test_tallies_must_equal_merged_junit(bundle: Path) -> None:
    edit_receipt(bundle, lambda d: d["suites"]["capture"].update(passed=5))
    problems = verify_bundle(bundle).problems
    assert len(problems) == 1 and problems[0].startswith("receipt.json: suites.capture is")


def test_verdict_must_follow_from_failures(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    finalize_bundle(out, failing_run(out, world=2, bad_rank=1))
    assert verify_bundle(out).ok

    def whitewash(data: dict) -> None:
        data.update(verdict="pass", status="source-qualified", root_cause=None)

    edit_receipt(out, whitewash)
    problems = verify_bundle(out).problems
    assert any(
        p.startswith("receipt.json: verdict is pass but its facts say fail") for p in problems
    )


def test_lazy_events_make_a_pass_inconsistent(bundle: Path) -> None:
    def add_event(data: dict) -> None:
        event = {"rank": 0, "test": "t", "detector": "jit", "what": "compiled", "signature": None}
        data["capture"].update(lazy_events=1, by_detector={"jit": 1}, events=[event])
        data["capture"]["per_rank"]["0"] = 1

    edit_receipt(bundle, add_event)
    problems = verify_bundle(bundle).problems
    assert any("1 lazy events during capture" in p for p in problems), problems


def _keep_limitations(data: dict, keep) -> None:
    """Drop limitations consistently from both forms (lines and {key, text} objects)."""
    data["limitation_items"] = [i for i in data["limitation_items"] if keep(i["key"])]
    data["limitations"] = [f"{i['key']}: {i['text']}" for i in data["limitation_items"]]


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda d: d.update(status="qualified"), "status qualified is not allowed"),
        (lambda d: d.update(status="not-qualified"), "status not-qualified is not allowed"),
        (
            lambda d: d.update(root_cause={"rank": 0, "test": None, "message": "x"}),
            "root_cause is present for a pass verdict",
        ),
        (
            lambda d: _keep_limitations(d, lambda key: key != "nccl"),
            "limitations do not name 'nccl'",
        ),
        (
            lambda d: (d.update(transports=["b12x"]), _keep_limitations(d, lambda key: False)),
            "limitations do not name 'image'",
        ),
        (
            # A receipt written before limitation_items: the keys are read from the lines.
            lambda d: (d.pop("limitation_items"), d.update(limitations=d["limitations"][1:])),
            "limitations do not name 'gpu-capture'",
        ),
        (
            lambda d: d.update(limitations=[x for x in d["limitations"] if "NCCL" not in x]),
            "limitation_items do not render to limitations",
        ),
        (lambda d: d["ranks"].update(expected=4), "schema: ranks:"),
        (
            lambda d: d["capture"].update(inactive_detectors={"triton-jit": "no triton"}),
            "limitations do not name 'detectors'",
        ),
    ],
)
def test_consistency_problems_are_reported(bundle: Path, change, expected: str) -> None:
    edit_receipt(bundle, change)
    problems = verify_bundle(bundle).problems
    assert any(expected in p for p in problems), problems


def test_qualified_needs_nccl_gpus_and_an_image_digest(bundle: Path) -> None:
    def claim(data: dict) -> None:
        data["status"] = "qualified"
        data["image"] = {"reference": "x", "digest": "sha256:" + "0" * 64}

    edit_receipt(bundle, claim)
    problems = verify_bundle(bundle).problems
    assert any(p.startswith("receipt.json: status qualified is not allowed") for p in problems)


@pytest.mark.parametrize(("change", "key"), DENIALS)
def test_a_forged_qualified_is_refused_naming_the_limitation_that_denies_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, object], key: str
) -> None:
    out = tmp_path / "bundle"
    assert gpu_run(out, monkeypatch, **change).status == "source-qualified"  # type: ignore[arg-type]
    edit_receipt(out, lambda d: d.update(status="qualified"))

    problems = verify_bundle(out).problems
    assert len(problems) == 1 and problems[0].startswith(
        "receipt.json: status qualified is not allowed"
    ), problems
    denied = problems[0].partition("(limitations that deny qualified: ")[2].removesuffix(")")
    assert key in denied.split(", "), problems[0]


def test_cli_exit_codes(bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(bundle)]) == 0
    assert "valid" in capsys.readouterr().out

    flip(bundle / "records" / "rank-00.json", "middle")
    flip(bundle / "summary.md", "first")
    assert main(["verify", str(bundle)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("records/rank-00.json: modified") for line in lines)
    assert any(line.startswith("summary.md: ") for line in lines)

    assert main(["verify", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "plain").write_text("x")
    assert main(["verify", str(tmp_path / "plain")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_cli_as_a_program(bundle: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def verify(target: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "harness", "verify", str(target)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            timeout=120,
            check=False,
        )

    assert verify(bundle).returncode == 0
    (bundle / "summary.md").unlink()
    done = verify(bundle)
    assert done.returncode == 1 and "summary.md: missing" in done.stdout.splitlines()
    assert verify(tmp_path / "missing").returncode == 2


# -- the receipt re-derived from the rank records ----------------------------------------------


def _no_rank_killed(receipt: dict[str, Any]) -> None:
    """Every rank complete, and the `ranks` limitation saying only what that leaves (the lost
    JUnit report), so that nothing but the records can tell."""
    receipt["ranks"].update(complete=4, killed=[], stopped=[])
    restate_limitations(receipt, "ranks")


@pytest.mark.parametrize(
    ("edit", "first"),
    [
        (
            _no_rank_killed,
            "receipt.json: ranks.complete is 4 but the rank records and JUnit reports say 3",
        ),
        (
            lambda d: d.update(transports=["b12x"]),
            "receipt.json: transports[0] is 'b12x' but the rank records and JUnit reports say "
            "'torch-dist'",
        ),
        (
            lambda d: d["signatures"][0].update(ranks=[0]),
            "receipt.json: signatures[0].ranks length is 1 but the rank records and JUnit "
            "reports say 3",
        ),
    ],
    ids=["killed-emptied", "transports", "signature-ranks"],
)
def test_a_self_consistent_forgery_is_caught_by_the_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Any, first: str
) -> None:
    out = tmp_path / "bundle"
    finalize_bundle(out, killed_run(out, world=4))
    assert verify_bundle(out).ok
    forge(out, edit)
    with monkeypatch.context() as patch:
        patch.setattr(verify, "rederive_problems", lambda *_: [])
        assert verify_bundle(out).ok  # every other layer is fooled
    assert verify_bundle(out).problems[0] == first


def test_launcher_facts_the_records_contradict_are_named_by_the_one_derivation(
    tmp_path: Path,
) -> None:
    """The writer carries the launcher's geometry through the derivation, whose own check holds
    it to the records that exist; verify applies that check to the receipt and reports it."""
    out = tmp_path / "bundle"
    receipt = finalize_bundle(out, replace(passing_run(out, world=2), backend="nccl"))
    assert receipt.geometry.backend == "nccl"  # the launcher's word, carried through
    facts = derive.derive(
        out, receipt.geometry, receipt.run, warm_impl=receipt.warm_impl, image=receipt.image
    )
    assert [
        (c.field, c.stated, c.recorded)
        for c in facts.corroborations(receipt.root_cause)
        if c.stated != c.recorded
    ] == [("geometry.backend", "nccl", "gloo")]
    said = "receipt.json: geometry.backend is 'nccl' but the rank records and JUnit reports"
    assert verify_bundle(out).problems[0] == f"{said} say 'gloo'"


def test_first_difference_names_the_deepest_first_leaf() -> None:
    mine = {"a": {"b": [1, 2], "c": 0}, "z": 1}
    theirs = {"a": {"b": [1, 3], "c": 1}, "z": 2}
    found = first_difference("x", mine, theirs)
    assert found is not None and (found.field, found.stated, found.derived) == ("x.a.b[1]", 2, 3)
    assert first_difference("x", {"k": True}, {"k": 1}) is not None  # no bool/int confusion
    assert first_difference("x", [1], [1, 2]).field == "x length"  # type: ignore[union-attr]
    assert first_difference("x", mine, mine) is None


def test_a_receipt_without_coverage_is_refused_and_cannot_hide_unrun_tests(
    tmp_path: Path,
) -> None:
    """Coverage is held to the records whatever the receipt states: dropping it (as a receipt
    from before it was recorded lacks it) switches off neither its check nor the failures it
    gives."""
    honest = tmp_path / "honest"
    finalize_bundle(honest, passing_run(honest, world=2))
    forge(honest, lambda d: d.pop("coverage"))
    assert verify_bundle(honest).problems == (
        "receipt.json: coverage is None but the rank records and JUnit reports say "
        "{'collected': 4, 'without_outcome': 0, 'first_without_outcome': None, "
        "'skipped_everywhere': 0, 'first_skipped_everywhere': None, 'skipped_on_some_ranks': 0, "
        "...",
    )

    early = tmp_path / "early"
    early.mkdir()
    for rank in range(2):
        write_rank(early, rank, 2, tests=[passed(NODES[0])], captures=[])
    finalize_bundle(early, context(2))
    forge(early, lambda d: d.pop("coverage"))  # the forger's way to drop the no-outcome reason
    assert verify_bundle(early).problems == (
        "receipt.json: verdict is 'pass' but the rank records and JUnit reports say 'fail'",
        "receipt.json: coverage is None but the rank records and JUnit reports say "
        "{'collected': 4, 'without_outcome': 6, 'first_without_outcome': 'rank 0: "
        "suites/transport/test_combine.py::TestCombine::test_matches_reference', 'skipped_eve...",
        # the forger kept the list the honest receipt had; its root cause is gone with the fail
        "receipt.json: failed_tests length is 1 but the rank records and JUnit reports say 0",
        "receipt.json: failures length is 0 but the rank records and JUnit reports say 1",
    )


@pytest.mark.parametrize("where", ["extra", "records"])
def test_a_folder_that_cannot_be_listed_is_a_problem_not_skipped(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """An empty folder nobody can list looks like nothing to a walk that skips it; verify
    names it (and, for `records`, the files SHA256SUMS lists that it cannot reach)."""
    hold_to_modes(monkeypatch, bundle.parent)
    lock(bundle / where)
    problems = verify_bundle(bundle).problems
    said = "a folder that cannot be listed, or inside one that cannot be entered"
    assert f"{where}: unreadable ({said}), so it was not checked" in problems
    assert main(["verify", str(bundle)]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_a_file_that_cannot_be_read_is_a_problem_not_a_crash(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = verify.sha256_file

    def refused(path: Path) -> str:
        if path.name == "rank-00.json":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path)

    monkeypatch.setattr(verify, "sha256_file", refused)
    problems = verify_bundle(bundle).problems
    assert problems == (
        "records/rank-00.json: cannot be read (Permission denied), so it was not checked",
    )
