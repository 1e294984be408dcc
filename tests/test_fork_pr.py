"""`dcpqual qualify-pr`: a fork pull request's base and head pinned in two locks, two image
builds, two engine-lane runs and a comparison; the plan and every argv on CPU, and the real
worktree / pin / commit steps against a local repository standing in for the fork, up to the
image build, which fails closed here (no Docker engine)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from _support.locks import git, make_repo, pinned_lock_data, write_lock

from harness.cli import main
from harness.errors import UsageError
from harness.qualify import fork_pr
from harness.qualify.fork_pr import EngineRun, plan_fork_pr, run_plan

REPO = "local-inference-lab/vllm"
URL = "https://github.com/local-inference-lab/vllm.git"
LOCK_REL = Path("images/kimi-k3-cu133-torch213/source.lock.json")
IMAGE_DIR = Path(__file__).resolve().parent.parent / "images/kimi-k3-cu133-torch213"


def _commit(repo: Path, name: str, message: str) -> str:
    (repo / name).write_text(f"# {message}\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    """A harness checkout with a pinned lock and the Dockerfiles; a 'remote' fork with pull
    request 7; a clone whose origin is the fork's GitHub URL, served from the remote."""
    harness = tmp_path / "harness"
    image_dir = harness / LOCK_REL.parent
    image_dir.mkdir(parents=True)
    for name in ("Dockerfile", "Dockerfile.foundation", "fetch-source.sh"):
        shutil.copy2(IMAGE_DIR / name, image_dir / name)
    write_lock(harness / LOCK_REL, pinned_lock_data())
    (harness / "pyproject.toml").write_text("[project]\nname = 'dcpqual'\n")
    git(harness, "init", "-q", "-b", "main")
    git(harness, "add", ".")
    git(harness, "commit", "-q", "-m", "harness")

    remote = make_repo(tmp_path / "remote", {"README": "fork\n"})
    base = git(remote, "rev-parse", "HEAD")
    git(remote, "checkout", "-q", "-b", "pr7")
    head = _commit(remote, "warm.py", "Build the B12X transports at layer construction")
    git(remote, "update-ref", "refs/pull/7/head", head)
    git(remote, "checkout", "-q", "main")
    _commit(remote, "later.py", "main moves on")

    clone = tmp_path / "fork"
    git(tmp_path, "init", "-q", str(clone))
    git(clone, "remote", "add", "origin", URL)
    git(clone, "config", f"url.file://{remote}.insteadOf", URL)
    return {"harness": harness, "clone": clone, "base": base, "head": head,
            "work": tmp_path / "work"}  # fmt: skip


def _plan(s: dict[str, Any], **change: Any) -> fork_pr.ForkPrPlan:
    values: dict[str, Any] = {
        "root": s["harness"],
        "repository": REPO,
        "number": 7,
        "head_sha": s["head"],
        "fork_repo": s["clone"],
        "work": s["work"],
    }
    values.update(change)
    return plan_fork_pr(**values)


def test_the_plan_pins_builds_and_runs_both_sides_then_compares(setup: dict[str, Any]) -> None:
    plan = _plan(setup)
    assert [(s.side, s.name) for s in plan.steps] == [
        *[(side, n) for side in ("base", "head")
          for n in ("worktree", "pin", "commit", "image", "engine")],
        ("compare", "markdown"),
        ("compare", "json"),
    ]  # fmt: skip
    work = setup["work"].resolve()
    py = (sys.executable, "-m", "harness")
    by = {(s.side, s.name): s for s in plan.steps}
    commit = git(setup["harness"], "rev-parse", "HEAD")
    assert by["base", "worktree"].argv == (
        "git", "-C", str(setup["harness"].resolve()), "worktree", "add", "--detach",
        str(work / "base"), commit,
    )  # fmt: skip
    assert by["head", "pin"].argv == (
        *py, "lock", "pin", "--component", "vllm", "--pr", "7", "--side", "head",
        "--base-ref", "refs/heads/main", "--repo", str(setup["clone"].resolve()),
        "--lock", str(work / "head" / LOCK_REL), "--expect-head", setup["head"],
    )  # fmt: skip
    assert by["base", "pin"].argv[10] == "base"
    assert by["head", "commit"].argv[-4:] == (
        "-m", f"Pin vllm to {REPO}#7 (head)", "--", str(LOCK_REL),
    )  # fmt: skip
    assert by["base", "image"].argv == (
        *py, "image", "build", "--context", str(work / "base"),
        "--out", str(work / "base" / "identity.json"),
    )  # fmt: skip
    engine = by["head", "engine"].engine
    assert engine == EngineRun(
        identity=work / "head" / "identity.json",
        lock=work / "head" / LOCK_REL,
        evidence_root=work / "evidence" / "head",
        command=fork_pr.engine_command("/evidence/{bundle}"),
    )
    assert by["compare", "markdown"].argv == (*py, "compare", "{base}", "{head}", "--markdown")
    assert by["compare", "json"].stdout == work / "compare.json"


def test_the_engine_lane_command(setup: dict[str, Any]) -> None:
    shell, flag, script = fork_pr.engine_command("/evidence/b1")
    assert (shell, flag) == ("sh", "-c")
    gates, run = script.split("; g=$?; ")
    assert gates == (
        "python -m harness.image.gates --where gpu --out /tmp/dcpqual-home/source-gates-gpu.json"
    )
    assert run.startswith(
        "DCPQUAL_GPU_GATES=/tmp/dcpqual-home/source-gates-gpu.json dcpqual run --models engine "
        "--nproc-per-node 16 --backend nccl --out /evidence/b1; r=$?;"
    )
    assert run.endswith('exit "$g"')


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"repository": "vllm"}, "is not OWNER/NAME"),
        ({"repository": "someone/vllm"}, "not https://github.com/someone/vllm.git"),
        ({"number": 0}, "1 or more"),
        ({"head_sha": "abc"}, "40-hex commit you reviewed"),
        ({"base_ref": "main"}, "must be a branch"),
    ],
)
def test_unusable_input_is_refused_before_anything_is_written(
    setup: dict[str, Any], change: dict[str, Any], needle: str
) -> None:
    with pytest.raises(UsageError, match=needle):
        _plan(setup, **change)
    assert not setup["work"].exists()


def test_a_clone_of_another_repository_or_a_used_work_folder_is_refused(
    setup: dict[str, Any],
) -> None:
    git(setup["clone"], "remote", "set-url", "origin", "https://github.com/other/vllm.git")
    with pytest.raises(UsageError, match=r"is a clone of https://github\.com/other/vllm\.git"):
        _plan(setup)
    git(setup["clone"], "remote", "set-url", "origin", URL)
    setup["work"].mkdir()
    (setup["work"] / "old").write_text("x")
    with pytest.raises(UsageError, match="is not empty"):
        _plan(setup)


def test_run_plan_substitutes_the_bundles_and_returns_compares_code(
    setup: dict[str, Any],
) -> None:
    plan = _plan(setup)
    calls: list[list[str]] = []

    def run(argv: Any, stdout: Path | None) -> int:
        calls.append(list(argv))
        return 1 if "compare" in argv else 0  # head regressed

    def engine(run_: EngineRun, emit: Any) -> tuple[int, Path]:
        return 0, run_.evidence_root / "20260101T000000Z-gpu16-abc"

    assert run_plan(plan, emit=lambda _: None, run=run, engine=engine) == 1
    compare = [c for c in calls if "compare" in c]
    work = setup["work"].resolve()
    assert compare[0][-3:] == [
        str(work / "evidence/base/20260101T000000Z-gpu16-abc"),
        str(work / "evidence/head/20260101T000000Z-gpu16-abc"),
        "--markdown",
    ]
    assert len(calls) == 10  # 4 commands per side, 2 compares


def test_run_plan_stops_at_a_failing_step_and_a_failed_head_fails(setup: dict[str, Any]) -> None:
    plan = _plan(setup)
    seen: list[str] = []

    def fails_image(argv: Any, stdout: Path | None) -> int:
        seen.append(argv[3] if argv[0] == sys.executable else argv[0])
        return 2 if argv[3:5] == ["image", "build"] else 0

    assert run_plan(plan, emit=lambda _: None, run=fails_image) == 2
    assert seen == ["git", "lock", "git", "image"]  # the base's build, then nothing

    def head_fails(run_: EngineRun, emit: Any) -> tuple[int, Path]:
        return (1 if "head" in str(run_.evidence_root) else 0), run_.evidence_root / "b"

    ok = run_plan(plan, emit=lambda _: None, run=lambda a, o: 0, engine=head_fails)
    assert ok == 1


def test_qualify_pr_runs_the_real_pins_and_the_build_fails_closed_here(
    setup: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """For real: the worktrees, `lock pin --pr` against the stand-in fork, the commits; then
    `dcpqual image build` finds no engine and the flow stops with its exit 2."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    monkeypatch.chdir(setup["harness"])
    argv = ["qualify-pr", "--repository", REPO, "--pr", "7", "--head-sha", setup["head"]]
    argv += ["--fork-repo", str(setup["clone"]), "--work", str(setup["work"])]
    assert main(argv) == 2
    captured = capfd.readouterr()
    assert "[base] image:" in captured.out and "[head] image:" not in captured.out
    built = [line for line in captured.err.splitlines() if "dcpqual image: error:" in line]
    assert len(built) == 1 and "no Docker engine reachable" in built[0], captured.err
    work = setup["work"]
    base_lock = json.loads((work / "base" / LOCK_REL).read_text())["components"]["vllm"]
    assert base_lock["source"]["commit"] == setup["base"]
    assert base_lock["pull_requests"] == []
    assert git(work / "base", "status", "--porcelain") == ""  # the pin is committed
    assert git(work / "base", "log", "-1", "--format=%s") == f"Pin vllm to {REPO}#7 (base)"
    assert not (work / "base" / "identity.json").exists()
    assert not (work / "head").exists()
    git(setup["harness"], "worktree", "remove", "--force", str(work / "base"))


def test_the_reviewed_head_is_enforced_at_pin_time(setup: dict[str, Any], tmp_path: Path) -> None:
    lock = write_lock(tmp_path / "l" / "source.lock.json", pinned_lock_data())
    code = main(
        ["lock", "pin", "--component", "vllm", "--pr", "7", "--repo", str(setup["clone"]),
         "--lock", str(lock), "--expect-head", "0" * 40]
    )  # fmt: skip
    assert code == 2
    assert json.loads(lock.read_text()) == pinned_lock_data()


def test_dry_run_prints_the_plan(setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.chdir(setup["harness"])
    argv = ["qualify-pr", "--repository", REPO, "--pr", "7", "--head-sha", setup["head"]]
    argv += ["--fork-repo", str(setup["clone"]), "--work", str(setup["work"]), "--dry-run"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 12 and not setup["work"].exists()
    assert "dcpqual run --models engine --nproc-per-node 16" in lines[4]
