"""Bad input through the real CLI: one line naming the problem, the right exit, nothing written.

One table (the bad-input matrix). Each `Case` builds its inputs under a fresh folder, runs
`python -m harness ...` as its own process (forked from a preloaded interpreter,
`_support.forked_cli`; a few cases also from a cold one, which must answer the same) whose
working directory is an empty folder beside them (so a default `evidence/<stamp>/` would show
up), and is held to the same rules by
`assert_refused`: the exit code (2 for unusable input; 1 for a bundle `dcpqual verify` finds
invalid), exactly one line on stderr, the named problem in the output, no traceback, and every
file and folder under the test's folder exactly as before (content hashes and mtimes).

`test_removing_a_check_lets_bad_input_through` runs cases in-process with the check that refuses
them patched away (lock hex and digest patterns, the placeholder sweep, tp/dcp and head-count
validation, the suites' geometry check, the refusal to reuse --out, verify's file check) and shows
`assert_refused` then fails.

`dcpqual lock check` with several problems prints each on its own line and then a count (tested
in tests/test_image_lock.py); every lock case here has exactly one problem.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _support import forked_cli
from _support.evidence_factory import passing_run
from _support.locks import DELETE, pinned_lock_data, set_at, write_lock

from harness.cli import main
from harness.evidence.writer import finalize_bundle
from harness.launch import launcher
from harness.schema.launch import Launch

REPO = Path(__file__).resolve().parent.parent

Setup = Callable[[Path, Path], list[str]]  # (folder for inputs, pristine bundle) -> argv


@dataclass(frozen=True)
class Case:
    id: str
    setup: Setup
    needle: str  # the problem, as the one error line (or verify's report) names it
    code: int = 2


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


# -- inputs ------------------------------------------------------------------------------------


Change = Callable[[dict[str, Any]], object]


def lock(change: Change | None = None, text: str | None = None) -> Setup:
    """`lock check` on a pinned lock with one thing wrong (or on raw `text`)."""

    def setup(folder: Path, pristine: Path) -> list[str]:
        path = folder / "source.lock.json"
        if text is not None:
            path.write_text(text)
        else:
            data = pinned_lock_data()
            if change is not None:
                change(data)
            write_lock(path, data)
        return ["lock", "check", str(path)]

    return setup


def with_value(dotted: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda data: set_at(data, dotted, value)


def argv(*args: str) -> Setup:
    """A command line; "{new}" becomes a folder that does not exist (and must not appear)."""
    return lambda folder, pristine: [a.replace("{new}", str(folder / "new-out")) for a in args]


def run_out(existing: dict[str, str] | None) -> Setup:
    """`dcpqual run --out DIR` at a DIR that already holds files (None: DIR is a file)."""

    def setup(folder: Path, pristine: Path) -> list[str]:
        out = folder / "old-evidence"
        if existing is None:
            out.write_text("not a folder\n")
        else:
            for rel, content in existing.items():
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                (out / rel).write_text(content)
        return ["run", "--nproc-per-node", "2", "--tp", "2", "--out", str(out)]

    return setup


def bundle(change: Callable[[Path], None]) -> Setup:
    """`dcpqual verify` on a copy of a valid 2-rank bundle after `change`."""

    def setup(folder: Path, pristine: Path) -> list[str]:
        copy = folder / "bundle"
        shutil.copytree(pristine, copy)
        change(copy)
        return ["verify", str(copy)]

    return setup


def flip_byte(rel: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        data = bytearray((root / rel).read_bytes())
        data[len(data) // 2] ^= 0x01
        (root / rel).write_bytes(bytes(data))

    return change


def truncate(rel: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        data = (root / rel).read_bytes()
        (root / rel).write_bytes(data[: len(data) // 2])

    return change


def remove(rel: str) -> Callable[[Path], None]:
    return lambda root: (root / rel).unlink()


SIG = ("signatures", "--model", "kimi-k3")

CASES = [
    # -- source lock: `dcpqual lock check FILE` --
    Case("lock-not-json", lock(text='{"schema": '), "not valid JSON: line 1"),
    Case("lock-absent", argv("lock", "check", "{new}"), "cannot read the lock"),
    Case("lock-missing-field", lock(with_value("versions", DELETE)), "versions: Field required"),
    Case(
        "lock-short-commit",
        lock(with_value("components.pytorch.source.commit", "abc1234")),
        "components.pytorch.source.commit: commit 'abc1234' is not a 40-hex git object id",
    ),
    Case(
        "lock-non-hex-tree",
        lock(with_value("components.nccl.source.tree", "g" * 40)),
        f"components.nccl.source.tree: tree '{'g' * 40}' is not a 40-hex git object id",
    ),
    Case(
        "lock-tag-without-digest",
        lock(with_value("foundation.image.digest", "")),
        "foundation.image.digest: tag 'nvidia/cuda:13.3.0-cudnn-devel-ubuntu24.04' has no "
        "sha256: digest",
    ),
    Case(
        "lock-placeholder-left-in",
        lock(with_value("versions.nccl", "<PIN: filled by dcpqual lock pin --component nccl>")),
        "versions.nccl: placeholder '<PIN: filled by dcpqual lock pin --component nccl>'",
    ),
    # -- geometry: `dcpqual signatures` --
    Case("sig-dcp-not-dividing-tp", argv(*SIG, "--tp", "16", "--dcp", "5"), "dcp=5 does not"),
    Case("sig-zero-tp", argv(*SIG, "--tp", "0", "--dcp", "1"), "tp must be a positive integer"),
    Case(
        "sig-negative-dcp",
        argv(*SIG, "--tp", "16", "--dcp", "-2"),
        "dcp must be a positive integer, got -2",
    ),
    Case(
        "sig-heads-not-divisible",
        argv(*SIG, "--tp", "64", "--dcp", "4"),
        "kimi-k3 has 96 attention heads: at tp=64 (2 per rank) a whole rank would hold only "
        "padding",
    ),
    Case(
        "sig-unknown-model",
        argv("signatures", "--model", "llama-4", "--tp", "16", "--dcp", "16"),
        "argument --model: invalid choice: 'llama-4'",
    ),
    Case(
        "sig-unknown-backend",
        argv(*SIG, "--tp", "16", "--dcp", "16", "--backend", "flash-mla-x"),
        "argument --backend: invalid choice: 'flash-mla-x'",
    ),
    # -- geometry and world size: `dcpqual run` (never gets as far as torchrun) --
    Case(
        "run-dcp-not-dividing-tp",
        argv("run", "--nproc-per-node", "2", "--tp", "16", "--dcp", "5", "--out", "{new}"),
        "dcp=5 does not divide tp=16",
    ),
    Case(
        "run-zero-ranks",
        argv("run", "--nproc-per-node", "0", "--out", "{new}"),
        "--nproc-per-node must be an integer >= 1, got 0",
    ),
    Case(
        "run-negative-tp",
        argv("run", "--nproc-per-node", "2", "--tp", "-4", "--out", "{new}"),
        "--tp must be an integer >= 1, got -4",
    ),
    Case(
        "run-real-tree-tp-not-dividing-heads",
        argv("run", "--nproc-per-node", "9", "--models", "real", "--tp", "9", "--out", "{new}"),
        "vLLM 0.32's kimi-k3 cannot be built on 9 ranks (tp=9): it asserts that tp divides its "
        "96 attention heads",
    ),
    Case(
        "run-heads-not-divisible",
        argv("run", "--nproc-per-node", "4", "--tp", "64", "--out", "{new}"),
        "kimi-k3 has 96 attention heads: at tp=64 (2 per rank) a whole rank would hold only "
        "padding",
    ),
    Case(
        "run-unknown-backend",
        argv("run", "--nproc-per-node", "2", "--backend", "mpi", "--out", "{new}"),
        "unknown --backend 'mpi'",
    ),
    Case(
        "run-world-size-the-geometry-cannot-use",
        argv("run", "--nproc-per-node", "3", "--dcp", "2", "--out", "{new}"),
        "world size 3 cannot be split into DCP groups of 2",
    ),
    Case(
        "run-world-size-not-a-dcp-of-tp",
        argv("run", "--nproc-per-node", "6", "--out", "{new}"),
        "world size 6 does not fit --tp 16: the default DCP (the world size, at most 16) must",
    ),
    Case(
        "run-out-not-empty",
        run_out({"receipt.json": '{"verdict": "pass"}\n', "records/rank-00.json": "{}\n"}),
        "is not empty (2 entries: receipt.json, records)",
    ),
    Case("run-out-is-a-file", run_out(None), "exists and is not a folder"),
    # -- pytest arguments after `--`: checked with pytest's parser before torchrun starts --
    *(
        Case(
            f"run-pytest-{name}",
            argv("run", "--nproc-per-node", "2", "--out", "{new}", "--", *extra),
            needle,
        )
        for name, extra, needle in (
            ("unknown-option", ["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
            ("missing-path", ["no/such_test.py"], "not found: no/such_test.py"),
            ("missing-node-id-file", ["no/such_test.py::t"], "not found: no/such_test.py"),
            (
                "xdist-plugin",
                ["-p", "xdist", "-n", "2"],
                "-p xdist cannot run under the ranks' lockstep",
            ),
            ("xdist-workers", ["-n", "2"], "-n cannot run under the ranks' lockstep"),
            ("last-failed", ["--lf"], "--lf needs pytest's cache; use dcpqual run --rerun-failed"),
            ("failed-first", ["--ff"], "--ff needs pytest's cache; use dcpqual run --rerun-failed"),
            ("exitfirst", ["-x"], "use dcpqual run's own --maxfail N"),
            ("exitfirst-in-a-cluster", ["-qx"], "use dcpqual run's own --maxfail N"),
            ("maxfail", ["--maxfail", "5"], "use dcpqual run's own --maxfail N"),
            ("setup-only", ["--setup-only"], "--setup-only runs no test body"),
            ("setup-plan", ["--setup-plan"], "--setup-plan runs no test body"),
            ("collect-only", ["--collect-only"], "--collect-only runs no test body"),
            ("junit-prefix", ["--junit-prefix=x"], "--junit-prefix renames every test"),
        )
    ),
    # -- `dcpqual verify DIR` --
    Case("verify-missing-folder", argv("verify", "{new}"), "new-out does not exist"),
    Case(
        "verify-tampered-record",
        bundle(flip_byte("records/rank-01.json")),
        "records/rank-01.json: modified",
        code=1,
    ),
    Case(
        "verify-truncated-report",
        bundle(truncate("junit/rank-00.xml")),
        "junit/rank-00.xml: modified",
        code=1,
    ),
    Case("verify-file-removed", bundle(remove("summary.md")), "summary.md: missing", code=1),
]


# -- the rules every case is held to -----------------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file and folder under `root`: (sha256 or "dir", mtime in ns)."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        kind = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
        found[rel] = (kind, path.stat().st_mtime_ns)
    return found


def assert_refused(
    case: Case, result: Result, before: dict[str, tuple[str, int]], root: Path
) -> None:
    lines = result.err.strip().splitlines()
    assert result.code == case.code, f"exit {result.code}, want {case.code}: {result.err}"
    assert len(lines) == 1, f"want one line on stderr, got {len(lines)}: {result.err!r}"
    assert "Traceback" not in result.out + result.err
    if case.code == 2:
        assert lines[0].startswith("dcpqual ") and ": error: " in lines[0], lines[0]
        assert case.needle in lines[0], f"{case.needle!r} not in {lines[0]!r}"
        assert result.out == ""
    else:
        assert case.needle in result.out, f"{case.needle!r} not in {result.out!r}"
        assert "INVALID" in lines[0]
    assert snapshot(root) == before, "the refused command wrote, moved or touched a file"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pristine") / "bundle"
    finalize_bundle(out, passing_run(out, world=2))
    return out


def prepared(case: Case, tmp_path: Path, pristine: Path) -> tuple[list[str], Path]:
    inputs, cwd = tmp_path / "inputs", tmp_path / "cwd"
    inputs.mkdir()
    cwd.mkdir()
    return case.setup(inputs, pristine), cwd


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_with_one_line_and_nothing_written(
    case: Case, tmp_path: Path, pristine: Path
) -> None:
    args, cwd = prepared(case, tmp_path, pristine)
    before = snapshot(tmp_path)
    done = forked_cli.run(args, cwd=cwd)
    assert_refused(case, Result(done.returncode, done.stdout, done.stderr), before, tmp_path)


# One case of each command, from a cold interpreter as a user starts it: the forked command line
# above must answer exactly as it does.
COLD = ["lock-not-json", "sig-heads-not-divisible", "run-out-not-empty", "verify-tampered-record"]


@pytest.mark.parametrize("case_id", COLD)
def test_a_cold_interpreter_refuses_as_the_forked_one_does(
    case_id: str, tmp_path: Path, pristine: Path
) -> None:
    answers = []
    for start in ("cold", "forked"):
        folder = tmp_path / start
        folder.mkdir()
        args, cwd = prepared(BY_ID[case_id], folder, pristine)
        command = forked_cli.cold if start == "cold" else forked_cli.run
        done = command(args, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)})
        text = (done.stdout + done.stderr).replace(str(folder), "FOLDER")
        answers.append((done.returncode, text))
    cold, forked = answers
    assert cold == forked
    assert cold[0] in (1, 2)


# -- each check, removed, lets its bad input through -------------------------------------------

BY_ID = {c.id: c for c in CASES}
ANYTHING = re.compile(r".*")
NOTHING = re.compile(r"(?!)")

# (case, the check that refuses it, what replaces that check)
REMOVED_CHECKS: list[tuple[str, str, object]] = [
    ("lock-short-commit", "harness.image.lock.HEX40", ANYTHING),
    ("lock-tag-without-digest", "harness.image.lock.SHA256_DIGEST", ANYTHING),
    ("lock-placeholder-left-in", "harness.image.lock.PLACEHOLDER", NOTHING),
    (
        "sig-dcp-not-dividing-tp",
        "harness.core.geometry.ParallelGeometry.__post_init__",
        lambda self: None,
    ),
    (
        "sig-heads-not-divisible",
        "harness.core.geometry.ParallelGeometry.local_heads",
        lambda self, num_heads, model="model": num_heads // self.tp,
    ),
    ("run-heads-not-divisible", "harness.launch.cli._check_suites_geometry", lambda options: None),
    (
        "run-real-tree-tp-not-dividing-heads",
        "harness.launch.cli._check_real_tree_geometry",
        lambda options: None,
    ),
    (
        "run-out-not-empty",
        "harness.evidence.writer.prepare_out_dir",
        lambda path: Path(path).absolute(),
    ),
    ("verify-tampered-record", "harness.evidence.verify._check_files", lambda *args: []),
]


def fake_launch(plan: Any, **kwargs: Any) -> Launch:
    """What a launch does to the out folder first (torchrun's log folder), without torchrun."""
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    stamp = "2026-01-01T00:00:00+00:00"
    return Launch(exit_code=1, timed_out=False, started_at=stamp, finished_at=stamp, elapsed_s=0.0)


@pytest.mark.parametrize(
    ("case_id", "target", "replacement"), REMOVED_CHECKS, ids=[r[0] for r in REMOVED_CHECKS]
)
def test_removing_a_check_lets_bad_input_through(
    case_id: str,
    target: str,
    replacement: object,
    tmp_path: Path,
    pristine: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In-process, the same case with its check patched away: `assert_refused` must fail."""
    case = BY_ID[case_id]
    args, cwd = prepared(case, tmp_path, pristine)
    before = snapshot(tmp_path)
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(launcher, "launch", fake_launch)  # never a real torchrun here
    monkeypatch.setattr(target, replacement)
    try:
        code, crash = main(args), ""
    except Exception:  # what the user would see as a traceback
        code, crash = 1, traceback.format_exc()
    captured = capsys.readouterr()
    result = Result(code, captured.out, captured.err + crash)
    with pytest.raises(AssertionError):
        assert_refused(case, result, before, tmp_path)
