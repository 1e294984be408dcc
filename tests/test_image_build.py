"""Build arguments and labels from the lock, the Dockerfile agreeing with them, the driver."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support.locks import git, pinned_lock_data, write_lock

from harness import gitinfo
from harness.cli import main
from harness.errors import UsageError
from harness.image import build, dockerfile
from harness.image.build import ImageBuildError
from harness.image.engine import EngineUnavailable, connect
from harness.image.lock import LockError, load_pinned_lock, lock_sha256

IMAGE_DIR = Path(__file__).resolve().parent.parent / "images/kimi-k3-cu133-torch213"
DOCKERFILE = (IMAGE_DIR / "Dockerfile").read_text()
HARNESS = gitinfo.GitIdentity(commit="c" * 40, tree="d" * 40, dirty=False)


@pytest.fixture
def lock_file(tmp_path: Path) -> Path:
    return write_lock(tmp_path / "lock" / "source.lock.json", pinned_lock_data())


@pytest.fixture
def args_and_labels(lock_file: Path) -> tuple[dict[str, str], dict[str, str]]:
    lock, sha = load_pinned_lock(lock_file), lock_sha256(lock_file)
    return build.build_args(lock, sha, HARNESS), build.image_labels(lock, sha, HARNESS)


@pytest.fixture
def harness_repo(tmp_path: Path) -> Path:
    """A clean git checkout holding the real Dockerfile and a pinned lock."""
    root = tmp_path / "harness"
    image_dir = root / "images/kimi-k3-cu133-torch213"
    image_dir.mkdir(parents=True)
    for name in ("Dockerfile", "fetch-source.sh"):
        shutil.copy2(IMAGE_DIR / name, image_dir / name)
    write_lock(image_dir / "source.lock.json", pinned_lock_data())
    (root / "pyproject.toml").write_text("[project]\nname = 'dcpqual'\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "harness")
    return root


# --- pure: arguments, labels, the Dockerfile -------------------------------------------------


def test_build_args_come_from_the_lock(lock_file: Path) -> None:
    lock, sha = load_pinned_lock(lock_file), lock_sha256(lock_file)
    args = build.build_args(lock, sha, HARNESS)
    data = json.loads(lock_file.read_text())
    assert args["BASE_IMAGE"] == (
        f"{data['base_image']['reference']}@{data['base_image']['digest']}"
    )
    assert args["LOCK_SHA256"] == sha
    assert (args["LOCK_CUDA_VERSION"], args["LOCK_TORCH_VERSION"]) == ("13.3", "2.13.0")
    assert args["LOCK_NCCL_VERSION"] == data["versions"]["nccl"]
    assert args["TORCH_CUDA_ARCH_LIST"] == "12.0a"
    for name, comp in data["components"].items():
        for field in ("repository", "ref", "commit", "tree"):
            assert args[f"SRC_{name.upper()}_{field.upper()}"] == comp["source"][field]
    assert (args["HARNESS_COMMIT"], args["HARNESS_TREE"], args["HARNESS_DIRTY"]) == (
        "c" * 40,
        "d" * 40,
        "false",
    )
    # Every value traces back to the lock file, the lock's bytes, or the harness tree.
    lock_text = lock_file.read_text()
    harness_values = {"c" * 40, "d" * 40, "false", sha, args["BASE_IMAGE"]}
    assert all(v in lock_text or v in harness_values for v in args.values())


def test_labels_carry_lock_sha_commits_and_trees(
    args_and_labels: tuple[dict[str, str], dict[str, str]], lock_file: Path
) -> None:
    _, labels = args_and_labels
    assert labels["io.dcpqual.lock.sha256"] == lock_sha256(lock_file)
    data = json.loads(lock_file.read_text())
    for name, comp in data["components"].items():
        assert labels[f"io.dcpqual.source.{name}.commit"] == comp["source"]["commit"]
        assert labels[f"io.dcpqual.source.{name}.tree"] == comp["source"]["tree"]
    assert labels["io.dcpqual.harness.tree"] == "d" * 40


def test_dockerfile_consumes_exactly_the_lock_arguments(
    args_and_labels: tuple[dict[str, str], dict[str, str]],
) -> None:
    args, labels = args_and_labels
    declared = dockerfile.declared_args(DOCKERFILE)
    assert set(declared) == set(args), "both directions: declared == passed"
    assert all(default is None for default in declared.values()), "no pin typed twice"
    assert set(declared) <= dockerfile.referenced_names(DOCKERFILE), "every ARG is used"
    assert dockerfile.undeclared_uses(DOCKERFILE, set(args)) == []
    assert dockerfile.labels(DOCKERFILE, args) == labels
    assert build.dockerfile_problems(DOCKERFILE, args, labels) == []


def test_dockerfile_builds_what_the_issue_asks_for() -> None:
    text = " ".join(i.value for i in dockerfile.instructions(DOCKERFILE))
    froms = [i.value for i in dockerfile.instructions(DOCKERFILE) if i.keyword == "FROM"]
    assert froms[0] == "${BASE_IMAGE} AS toolchain" and len(froms) >= 5  # multi-stage
    assert "USE_SYSTEM_NCCL=1" in text and "PYTORCH_BUILD_VERSION" in text
    assert "fetch-source pytorch" in text and "--submodules" in text
    assert "python -m harness.image.verify_runtime" in text


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda t: t.replace("ARG SRC_B12X_TREE\nRUN", "RUN", 1), "used in stage b12x"),
        (lambda t: t.replace("ARG HARNESS_DIRTY\n", ""), "declares no ARG HARNESS_DIRTY"),
        (lambda t: t.replace("ARG BASE_IMAGE\n", "ARG BASE_IMAGE=ubuntu\n", 1), "has a default"),
        (lambda t: t + "ARG FLASHINFER_COMMIT\n", "not computed from the lock"),
        (lambda t: t.replace('.tree="${SRC_VLLM_TREE}"', '.tree="x"'), "label io.dcpqual"),
        (lambda t: t + "LABEL extra=1\n", "label extra"),
    ],
)
def test_dockerfile_drift_is_caught(
    args_and_labels: tuple[dict[str, str], dict[str, str]], mutate: Any, needle: str
) -> None:
    args, labels = args_and_labels
    mutated = mutate(DOCKERFILE)
    assert mutated != DOCKERFILE
    problems = build.dockerfile_problems(mutated, args, labels)
    assert any(needle in p for p in problems), problems


def test_extra_build_argument_is_caught(
    args_and_labels: tuple[dict[str, str], dict[str, str]],
) -> None:
    args, labels = args_and_labels
    problems = build.dockerfile_problems(DOCKERFILE, {**args, "SRC_X_COMMIT": "1"}, labels)
    assert problems == [
        "build argument SRC_X_COMMIT is passed but the Dockerfile declares no ARG SRC_X_COMMIT"
    ]


def test_instructions_join_continuations() -> None:
    text = "# c\nFROM a AS b\nRUN one \\\n  # inner comment\n  two\nARG X\n"
    got = [(i.keyword, i.value, i.line) for i in dockerfile.instructions(text)]
    assert got == [("FROM", "a AS b", 2), ("RUN", "one two", 3), ("ARG", "X", 6)]


# --- context ---------------------------------------------------------------------------------


def test_context_tar_is_reproducible_and_keeps_modes(harness_repo: Path) -> None:
    files = gitinfo.tracked_files(harness_repo)
    first = build.context_tar(harness_repo, files)
    os.utime(harness_repo / "pyproject.toml", (1, 1))
    assert build.context_tar(harness_repo, files) == first
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == files
    assert members["images/kimi-k3-cu133-torch213/fetch-source.sh"].mode == 0o755
    assert members["pyproject.toml"].mode == 0o644
    assert {m.mtime for m in members.values()} == {0}


# --- plan: everything checked before an engine ------------------------------------------------


def test_plan_of_a_clean_pinned_tree(harness_repo: Path) -> None:
    plan = build.plan_build(harness_repo)
    assert plan.lock_path == Path("images/kimi-k3-cu133-torch213/source.lock.json")
    assert plan.tag == f"dcpqual/kimi-k3-cu133-torch213:lock-{plan.lock_sha256[:12]}"
    assert plan.args["HARNESS_COMMIT"] == git(harness_repo, "rev-parse", "HEAD")
    assert plan.args["HARNESS_DIRTY"] == "false"
    assert "images/kimi-k3-cu133-torch213/source.lock.json" in plan.context_files


def test_plan_refuses_a_dirty_tree_unless_allowed(harness_repo: Path) -> None:
    (harness_repo / "untracked.py").write_text("x = 1\n")
    with pytest.raises(UsageError, match="--allow-dirty"):
        build.plan_build(harness_repo)
    plan = build.plan_build(harness_repo, allow_dirty=True)
    assert plan.args["HARNESS_DIRTY"] == "true"
    assert plan.labels["io.dcpqual.harness.dirty"] == "true"
    assert "untracked.py" not in plan.context_files  # tracked files only


def test_plan_refuses_the_template_lock(harness_repo: Path) -> None:
    lock = harness_repo / "images/kimi-k3-cu133-torch213/source.lock.json"
    shutil.copy2(IMAGE_DIR / "source.lock.json", lock)
    with pytest.raises(LockError, match="has no sha256: digest"):
        build.plan_build(harness_repo, allow_dirty=True)


def test_plan_refuses_a_lock_outside_the_context(harness_repo: Path, lock_file: Path) -> None:
    with pytest.raises(UsageError, match="outside the build context"):
        build.plan_build(harness_repo, lock_file)


# --- engine absent (for real: this machine has none) -----------------------------------------


def test_no_engine_is_one_line_exit_2_and_nothing_written(
    harness_repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    out = tmp_path / "identity.json"
    code = main(["image", "build", "--context", str(harness_repo), "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("dcpqual image: error: no Docker engine reachable at unix://")
    assert not out.exists()
    assert git(harness_repo, "status", "--porcelain") == ""


def test_default_engine_is_absent_here() -> None:
    try:
        client = connect("this test")
    except EngineUnavailable as exc:
        assert "no Docker engine reachable" in str(exc)
        assert "\n" not in str(exc)
    else:  # pragma: no cover - only on a machine with a Docker engine
        client.close()
        pytest.skip("a Docker engine is reachable here")


# --- the driver, against a fake engine --------------------------------------------------------


class FakeContainer:
    def __init__(self, logs: bytes, code: int = 0) -> None:
        self._logs, self._code, self.removed = logs, code, False

    def wait(self) -> dict[str, int]:
        return {"StatusCode": self._code}

    def logs(self, **_: Any) -> bytes:
        return self._logs

    def remove(self, force: bool = False) -> None:
        self.removed = True


class FakeClient:
    """Records what the driver asked for and answers like an engine would."""

    def __init__(self, events: list[dict[str, Any]], labels: dict[str, str], report: dict) -> None:
        self.events, self.labels, self.report = events, labels, report
        self.build_kwargs: dict[str, Any] = {}
        self.run_calls: list[tuple[Any, ...]] = []
        self.api = self
        self.containers = self

    def build(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        self.build_kwargs = kwargs
        return iter(self.events)

    def inspect_image(self, image_id: str) -> dict[str, Any]:
        return {"Id": "sha256:" + "e" * 64, "RepoDigests": [], "Config": {"Labels": self.labels}}

    def run(self, image: str, command: list[str], **kwargs: Any) -> FakeContainer:
        self.run_calls.append((image, command, kwargs))
        return FakeContainer(json.dumps(self.report).encode())


BUILD_EVENTS = [
    {"stream": "Step 1/60 : ARG BASE_IMAGE\n"},
    {"status": "Pulling fs layer", "id": "abc"},
    {"aux": {"ID": "sha256:" + "e" * 64}},
    {"stream": "Successfully built eeeeeeeeeeee\n"},
]


def test_run_build_records_id_digest_labels_and_the_in_image_check(harness_repo: Path) -> None:
    plan = build.plan_build(harness_repo)
    client = FakeClient(BUILD_EVENTS, dict(plan.labels), {"ok": True, "mismatches": []})
    lines: list[str] = []
    identity = build.run_build(plan, client, lines.append)

    kw = client.build_kwargs
    assert kw["buildargs"] == plan.args and kw["custom_context"] and kw["decode"]
    assert kw["dockerfile"] == "images/kimi-k3-cu133-torch213/Dockerfile"
    assert kw["tag"] == plan.tag and kw["timeout"] is None
    with tarfile.open(fileobj=kw["fileobj"]) as tar:
        assert "images/kimi-k3-cu133-torch213/source.lock.json" in tar.getnames()
    assert "Step 1/60 : ARG BASE_IMAGE" in lines and "abc Pulling fs layer" in lines

    image, command, run_kwargs = client.run_calls[0]
    assert image == "sha256:" + "e" * 64
    assert command == ["python", "-m", "harness.image.verify_runtime", "--json"]
    assert run_kwargs.get("privileged") is False

    data = identity.to_json()
    assert data["image_id"] == data["digest"] == "sha256:" + "e" * 64
    assert data["source_lock_sha256"] == plan.lock_sha256
    assert data["sources"]["pytorch"]["commit"] == plan.args["SRC_PYTORCH_COMMIT"]
    assert data["harness"] == {
        "commit": plan.harness.commit,
        "tree": plan.harness.tree,
        "dirty": False,
    }
    assert (data["runtime"]["ok"], data["runtime"]["mismatches"]) == (True, [])
    assert data["built_at"].endswith("Z")


def test_run_build_refuses_an_in_image_report_it_cannot_read(harness_repo: Path) -> None:
    plan = build.plan_build(harness_repo)
    client = FakeClient(BUILD_EVENTS, dict(plan.labels), {"ok": True, "surprise": 1})
    with pytest.raises(
        ImageBuildError, match=r"in-image check's report is not valid: surprise: Extra"
    ):
        build.run_build(plan, client, lambda _: None)


def test_run_build_refuses_an_image_without_the_lock_labels(harness_repo: Path) -> None:
    plan = build.plan_build(harness_repo)
    labels = {**plan.labels, "io.dcpqual.lock.sha256": "0" * 64}
    client = FakeClient(BUILD_EVENTS, labels, {"ok": True})
    with pytest.raises(ImageBuildError, match=r"io\.dcpqual\.lock\.sha256"):
        build.run_build(plan, client, lambda _: None)


def test_build_error_event_is_one_line() -> None:
    events = [{"stream": "Step 9\n"}, {"error": "x", "errorDetail": {"message": "make\nfailed"}}]
    with pytest.raises(ImageBuildError, match=r"build failed: make failed$"):
        build.consume_build_events(events, lambda _: None)


def test_build_without_an_id_fails_and_short_id_is_a_fallback() -> None:
    with pytest.raises(ImageBuildError, match="without reporting an image id"):
        build.consume_build_events([{"stream": "Step 1\n"}], lambda _: None)
    events = [{"stream": "Successfully built 0123456789ab\n"}]
    assert build.consume_build_events(events, lambda _: None) == "0123456789ab"


def test_repo_digest_wins_over_the_image_id(harness_repo: Path) -> None:
    plan = build.plan_build(harness_repo)
    inspect = {
        "Id": "sha256:" + "e" * 64,
        "RepoDigests": ["registry.example/dcpqual@sha256:" + "f" * 64],
        "Config": {"Labels": plan.labels},
    }
    identity = build.identity_from(plan, inspect, None, "2026-01-01T00:00:00Z")
    assert identity.digest == "sha256:" + "f" * 64
    assert identity.image_id == "sha256:" + "e" * 64
