"""The source lock: schema (good and bad locks), `lock check`, `lock pin` on a real git repo."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from _support.locks import (
    DELETE,
    TEMPLATE,
    fake_hex,
    git,
    make_repo,
    pinned_lock_data,
    prebuilt_foundation_lock_data,
    set_at,
    write_lock,
)

from harness.cli import main
from harness.errors import UsageError
from harness.image.lock import (
    LockError,
    check_lock,
    fetch_pull_request,
    load_lock,
    load_pinned_lock,
    lock_sha256,
    pin_component,
    pin_pull_request,
)

# --- schema and check ------------------------------------------------------------------------


def test_shipped_template_loads_but_does_not_pin() -> None:
    load_lock(TEMPLATE)  # the shape is right, so `lock pin` can fill it
    problems = check_lock(TEMPLATE)
    assert problems, "the template must fail lock check until pinned"
    assert all("\n" not in p for p in problems)
    paths = [p.split(":", 1)[0] for p in problems]
    assert len(paths) == len(set(paths)), "one line per field"
    for where in (
        "foundation.image.digest",
        "versions.nccl",
        "versions.triton",
        "components.pytorch.source.commit",
        "components.pytorch.source.tree",
        "components.vllm.source.ref",
    ):
        assert where in paths
    # The fork and b12x are known: their repositories are no longer placeholders.
    data = json.loads(TEMPLATE.read_text())
    assert data["components"]["vllm"]["source"]["repository"] == (
        "https://github.com/local-inference-lab/vllm.git"
    )
    assert data["components"]["b12x"]["source"]["repository"] == (
        "https://github.com/local-inference-lab/b12x.git"
    )
    with pytest.raises(LockError):
        load_pinned_lock(TEMPLATE)


def test_pinned_lock_passes(tmp_path: Path) -> None:
    path = write_lock(tmp_path / "source.lock.json", pinned_lock_data())
    assert check_lock(path) == []
    lock = load_pinned_lock(path)
    assert lock.foundation.image.pinned.startswith("nvidia/cuda:13.3.0-")
    assert "@sha256:" in lock.foundation.image.pinned
    assert set(lock.components) == {"nccl", "pytorch", "vllm", "b12x"}


GOOD_PR = {"number": 7, "head": fake_hex("h"), "merge_commit": None, "title": "Warm Kimi-K3 MLA"}

BAD_LOCKS = [
    ("components.pytorch.source.commit", "abc123", "components.pytorch.source.commit", "40-hex"),
    ("components.nccl.source.tree", fake_hex("t").upper(), "components.nccl.source.tree", "40-hex"),
    ("foundation.image.digest", "", "foundation.image.digest", "has no sha256: digest"),
    ("foundation.image.digest", "sha256:abc", "foundation.image.digest", "has no sha256: digest"),
    ("foundation.image.digest", DELETE, "foundation.image.digest", "Field required"),
    (
        "foundation.image.reference",
        "nvidia/cuda:12.9.1-devel-ubuntu24.04",
        "foundation.image.reference",
        "not a CUDA 13.3",
    ),
    ("foundation.labels", {"a": "13.3"}, "foundation.labels", "asserts no labels"),
    ("foundation.kind", "prebuilt", "foundation.kind", "Input should be"),
    ("components.vllm.source.ref", "main", "components.vllm.source.ref", "ambiguous"),
    (
        "components.pytorch.source.ref",
        "refs/tags/v2.12.0",
        "components.pytorch.source.ref",
        "not refs/tags/v2.13.0",
    ),
    (
        "components.nccl.source.ref",
        "refs/tags/v2.27.3-1",
        "components.nccl.source.ref",
        "not the tag of NCCL 2.28.9",
    ),
    (
        "components.vllm.source.repository",
        "/home/me/vllm",
        "components.vllm.source.repository",
        "not an https://",
    ),
    (
        "components.b12x.source_patches",
        ["fix.patch"],
        "components.b12x.source_patches",
        "carry changes as commits",
    ),
    (
        "components.vllm.pull_requests",
        [{**GOOD_PR, "head": "abc"}],
        "components.vllm.pull_requests.0.head",
        "40-hex",
    ),
    (
        "components.vllm.pull_requests",
        [{**GOOD_PR, "number": 0}],
        "components.vllm.pull_requests.0.number",
        "greater than or equal to 1",
    ),
    ("versions.cuda", "13.2", "versions.cuda", "is for cu133"),
    ("versions.cuda", "13", "versions.cuda", "MAJOR.MINOR"),
    ("versions.torch", "2.12.0", "versions.torch", "is for torch213"),
    ("versions.torch", "2.13", "versions.torch", "MAJOR.MINOR.PATCH"),
    ("versions.nccl", "2.28", "versions.nccl", "MAJOR.MINOR.PATCH"),
    ("versions.triton", "latest", "versions.triton", "MAJOR.MINOR.PATCH"),
    ("versions.torch_cuda_arch_list", "sm_120", "versions.torch_cuda_arch_list", "arch list"),
    ("components.b12x", DELETE, "components.b12x", "missing (b12x_from.kind is repository)"),
    ("components.pytorch", DELETE, "components.pytorch", "built from source"),
    ("components.vllm", DELETE, "components.vllm", "missing"),
    ("b12x_from.index_url", "https://flashinfer.ai/whl/", "b12x_from", "for kind flashinfer"),
    ("python_pins.0.why", " ", "python_pins.0.why", "says why"),
    ("python_pins.0.version", ">=4.7", "python_pins.0.version", "exact version"),
    ("python_pins.1.name", "nvidia_cutlass_dsl", "python_pins.1.name", "pinned twice"),
    ("source_gates.0.component", "flashinfer", "source_gates.0.component", "not a component"),
    ("source_gates.0.tests", ["../escape.py"], "source_gates.0.tests.0", "inside the tree"),
    ("source_gates.0.tests", [], "source_gates.0.tests", "at least 1"),
    (
        "vllm_build.build_requirements",
        "requirements/build.txt/..",
        "vllm_build.build_requirements",
        "requirements/*.txt",
    ),
    ("build.nvcc_threads", 0, "build.nvcc_threads", "greater than or equal to 1"),
    (
        "components.vllm.pull_requests",
        [GOOD_PR, GOOD_PR],
        "components.vllm.pull_requests.1.number",
        "listed twice",
    ),
    ("components.vllm.source.extra", "x", "components.vllm.source.extra", "Extra inputs"),
    ("schema", "dcpqual-source-lock/v1", "schema", "Input should be"),
    ("components.vllm.source.title", "TODO", "components.vllm.source.title", "Extra inputs"),
]


@pytest.mark.parametrize(("where", "value", "path", "needle"), BAD_LOCKS)
def test_bad_lock_is_reported_on_one_line(
    tmp_path: Path, where: str, value: Any, path: str, needle: str
) -> None:
    data = pinned_lock_data()
    set_at(data, where, value)
    problems = check_lock(write_lock(tmp_path / "source.lock.json", data))
    assert problems, f"{where}={value!r} must be a problem"
    hits = [p for p in problems if p.startswith(f"{path}:")]
    assert hits and needle in hits[0], problems
    assert all("\n" not in p for p in problems)


def test_branch_ref_without_commit_is_branch_only(tmp_path: Path) -> None:
    data = pinned_lock_data()
    data["components"]["vllm"]["source"].update(ref="refs/heads/main", commit="")
    problems = check_lock(write_lock(tmp_path / "source.lock.json", data))
    assert any("is a branch and no commit pins it" in p for p in problems)


def test_placeholder_anywhere_is_a_problem(tmp_path: Path) -> None:
    data = pinned_lock_data()
    data["components"]["vllm"]["pull_requests"] = [{**GOOD_PR, "title": "TODO"}]
    problems = check_lock(write_lock(tmp_path / "source.lock.json", data))
    assert problems == ["components.vllm.pull_requests.0.title: placeholder 'TODO' is not pinned"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [("{not json", "not valid JSON: line 1"), ("[1, 2]", "must be a JSON object")],
)
def test_unreadable_lock(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "source.lock.json"
    path.write_text(text)
    problems = check_lock(path)
    assert len(problems) == 1 and needle in problems[0]


@pytest.mark.parametrize(
    ("dotted", "value"),
    [
        ("components.vllm.source.commit", "{}\n"),
        ("components.b12x.source.tree", "{}\n"),
        ("components.vllm.upstream_base.commit", "{}\n"),
        ("foundation.image.digest", "{}\n"),
        ("versions.nccl", "{}\n"),
        ("components.nccl.source.repository", "{}\n"),
    ],
)
def test_a_pin_with_a_trailing_newline_is_not_a_pin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dotted: str, value: str
) -> None:
    data = pinned_lock_data()
    *parents, leaf = dotted.split(".")
    holder = data
    for key in parents:
        holder = holder[key]
    holder[leaf] = value.format(holder[leaf])
    path = write_lock(tmp_path / "source.lock.json", data)
    assert main(["lock", "check", str(path)]) == 2
    assert dotted in capsys.readouterr().err


def test_duplicate_keys_make_a_lock_ambiguous(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = json.dumps(pinned_lock_data(), indent=2)
    commit = pinned_lock_data()["components"]["vllm"]["source"]["commit"]
    # A second "commit" key: json.loads would keep the last one silently.
    text = good.replace(
        f'"commit": "{commit}"', f'"commit": "{"0" * 40}",\n"commit": "{commit}"', 1
    )
    assert text != good
    path = tmp_path / "source.lock.json"
    path.write_text(text)
    assert main(["lock", "check", str(path)]) == 2
    assert "duplicate key 'commit'" in capsys.readouterr().err


def test_lock_sha256_is_over_the_bytes(tmp_path: Path) -> None:
    path = write_lock(tmp_path / "source.lock.json", pinned_lock_data())
    assert lock_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_cli_lock_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lock", "check", str(TEMPLATE)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == len(check_lock(TEMPLATE)) + 1
    assert err[-1].startswith("dcpqual lock: error:") and "problem(s)" in err[-1]
    good = write_lock(tmp_path / "source.lock.json", pinned_lock_data())
    assert main(["lock", "check", str(good)]) == 0
    assert f"ok (sha256 {lock_sha256(good)})" in capsys.readouterr().out
    assert main(["lock", "check", str(tmp_path / "absent.json")]) == 2


# --- pin -------------------------------------------------------------------------------------


def test_pin_fills_commit_tree_and_ref_from_a_checkout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = tmp_path / "source.lock.json"
    lock.write_bytes(TEMPLATE.read_bytes())
    repo = make_repo(tmp_path / "b12x", {"pyproject.toml": "[project]\nname='b12x'\n"})
    git(repo, "remote", "add", "origin", "https://example.org/b12x.git")
    git(repo, "tag", "v1.5.1")
    before = json.loads(lock.read_text())

    argv = ["lock", "pin", "--component", "b12x", "--repo", str(repo), "--lock", str(lock)]
    assert main(argv) == 0
    after = json.loads(lock.read_text())
    src = after["components"]["b12x"]["source"]
    assert src["commit"] == git(repo, "rev-parse", "HEAD")
    assert src["tree"] == git(repo, "rev-parse", "HEAD^{tree}")
    assert src["ref"] == "refs/tags/v1.5.1"
    # A repository the lock already names is kept (the clone's origin may be a mirror).
    assert src["repository"] == "https://github.com/local-inference-lab/b12x.git"
    # Nothing else moved.
    expected = copy.deepcopy(before)
    expected["components"]["b12x"]["source"] = src
    assert after == expected
    out = capsys.readouterr().out
    assert "filled components.b12x.source.commit" in out
    assert not [p for p in check_lock(lock) if p.startswith("components.b12x")]


def test_pin_nccl_reads_its_version_and_the_branch(tmp_path: Path) -> None:
    lock = tmp_path / "source.lock.json"
    lock.write_bytes(TEMPLATE.read_bytes())
    version_mk = "NCCL_MAJOR   := 2\nNCCL_MINOR   := 28\nNCCL_PATCH   := 9\nNCCL_SUFFIX  :=\n"
    repo = make_repo(tmp_path / "nccl", {"makefiles/version.mk": version_mk})
    result = pin_component(lock, "nccl", repo)
    data = json.loads(lock.read_text())
    assert data["versions"]["nccl"] == "2.28.9"
    assert data["components"]["nccl"]["source"]["ref"] == "refs/heads/main"
    assert "versions.nccl" in result.filled


def test_pin_vllm_fills_upstream_merge_base(tmp_path: Path) -> None:
    lock = tmp_path / "source.lock.json"
    lock.write_bytes(TEMPLATE.read_bytes())
    repo = make_repo(tmp_path / "vllm", {"README": "upstream\n"})
    git(repo, "tag", "v0.32.0")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "kimi.py").write_text("# fork change\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "fork")
    pin_component(lock, "vllm", repo)
    assert json.loads(lock.read_text())["components"]["vllm"]["upstream_base"]["commit"] == base


def test_pin_refuses_a_dirty_checkout_and_writes_nothing(tmp_path: Path) -> None:
    lock = tmp_path / "source.lock.json"
    lock.write_bytes(TEMPLATE.read_bytes())
    repo = make_repo(tmp_path / "b12x", {"a.py": "x = 1\n"})
    (repo / "a.py").write_text("x = 2\n")
    with pytest.raises(UsageError, match="uncommitted"):
        pin_component(lock, "b12x", repo)
    assert lock.read_bytes() == TEMPLATE.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b12x", "source.lock.json"]


def test_pin_refuses_head_that_is_not_the_locked_ref(tmp_path: Path) -> None:
    lock = tmp_path / "source.lock.json"
    lock.write_bytes(TEMPLATE.read_bytes())
    repo = make_repo(tmp_path / "pytorch", {"version.txt": "2.13.0a0\n"})
    git(repo, "tag", "v2.13.0")
    (repo / "x").write_text("later\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "later")
    with pytest.raises(UsageError, match=r"check out refs/tags/v2\.13\.0 first"):
        pin_component(lock, "pytorch", repo)
    assert lock.read_bytes() == TEMPLATE.read_bytes()


def test_pin_refuses_a_pytorch_of_another_version(tmp_path: Path) -> None:
    lock = tmp_path / "source.lock.json"
    lock.write_bytes(TEMPLATE.read_bytes())
    repo = make_repo(tmp_path / "pytorch", {"version.txt": "2.12.0a0\n"})
    with pytest.raises(UsageError, match=r"pytorch 2\.12\.0"):
        pin_component(lock, "pytorch", repo)


def test_pin_unknown_component_or_not_a_repo(tmp_path: Path) -> None:
    lock = tmp_path / "source.lock.json"
    lock.write_bytes(TEMPLATE.read_bytes())
    repo = make_repo(tmp_path / "r", {"a": "a\n"})
    with pytest.raises(UsageError, match="no component 'flashinfer'"):
        pin_component(lock, "flashinfer", repo)
    plain = tmp_path / "plain"
    plain.mkdir()
    code = main(["lock", "pin", "--component", "b12x", "--repo", str(plain), "--lock", str(lock)])
    assert code == 2
    assert lock.read_bytes() == TEMPLATE.read_bytes()


# --- foundation, versions as data, b12x from flashinfer-python --------------------------------


def test_a_prebuilt_foundation_on_newer_versions_passes(tmp_path: Path) -> None:
    path = write_lock(tmp_path / "source.lock.json", prebuilt_foundation_lock_data())
    assert check_lock(path) == []
    lock = load_pinned_lock(path)
    assert (lock.versions.cuda, lock.versions.torch) == ("13.4", "2.14.0a0")
    assert set(lock.components) == {"vllm", "b12x"}


@pytest.mark.parametrize(
    ("mutate", "path", "needle"),
    [
        (lambda d: d["foundation"].update(labels={}), "foundation.labels", "held to labels"),
        (
            lambda d: d["foundation"]["labels"].pop("local-inference.nccl.version"),
            "foundation.labels",
            "no label says nccl 2.30.4",
        ),
        (
            lambda d: d["components"].update(nccl=pinned_lock_data()["components"]["nccl"]),
            "components.nccl",
            "prebuilt foundation carries it",
        ),
        (lambda d: d.update(image="kimi-k3-cu133-torch214"), "versions.cuda", "is for cu133"),
    ],
)
def test_a_prebuilt_foundation_is_held_to_its_labels(
    tmp_path: Path, mutate: Any, path: str, needle: str
) -> None:
    data = prebuilt_foundation_lock_data()
    mutate(data)
    problems = check_lock(write_lock(tmp_path / "source.lock.json", data))
    hits = [p for p in problems if p.startswith(f"{path}:")]
    assert hits and needle in hits[0], problems


def test_b12x_from_a_named_flashinfer_build(tmp_path: Path) -> None:
    data = pinned_lock_data()
    data["b12x_from"] = {
        "kind": "flashinfer-python",
        "flashinfer_version": "0.7.1",
        "index_url": "https://flashinfer.ai/whl/",
    }
    path = write_lock(tmp_path / "source.lock.json", data)
    assert check_lock(path) == [
        "components.b12x: b12x comes from flashinfer-python; remove the component"
    ]
    del data["components"]["b12x"]
    data["source_gates"] = [g for g in data["source_gates"] if g["component"] != "b12x"]
    assert check_lock(write_lock(path, data)) == []
    data["b12x_from"]["flashinfer_version"] = ">=0.7"
    assert any("exact version" in p for p in check_lock(write_lock(path, data)))


def test_a_pull_request_ref_must_be_recorded_with_its_head(tmp_path: Path) -> None:
    data = pinned_lock_data()
    vllm = data["components"]["vllm"]
    vllm["source"]["ref"] = "refs/pull/7/head"
    path = write_lock(tmp_path / "source.lock.json", data)
    assert any("names pull request 7; record it" in p for p in check_lock(path))
    vllm["pull_requests"] = [{**GOOD_PR, "head": vllm["source"]["commit"]}]
    assert check_lock(write_lock(path, data)) == []
    vllm["pull_requests"] = [GOOD_PR]  # a head that is not the commit built
    assert any("not its recorded head" in p for p in check_lock(write_lock(path, data)))


# --- pin a fork pull request (a local repository stands in for the fork's remote) -------------


def _commit(repo: Path, name: str, text: str, message: str) -> str:
    (repo / name).write_text(text)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def fork(tmp_path: Path) -> dict[str, Any]:
    """A 'remote' fork with main, an upstream tag, and pull request 7 (refs/pull/7/head), and
    a clone of it (origin = the remote) to pin from."""
    remote = make_repo(tmp_path / "remote", {"README": "upstream\n"})
    git(remote, "tag", "v0.32.0")
    base = _commit(remote, "kimi.py", "# fork\n", "fork main")
    git(remote, "checkout", "-q", "-b", "pr7")
    head = _commit(remote, "warm.py", "# warm\n", "Warm Kimi-K3 MLA transports at load")
    git(remote, "update-ref", "refs/pull/7/head", head)
    git(remote, "checkout", "-q", "main")
    _commit(remote, "later.py", "# later on main\n", "main moves on")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(remote), str(clone))
    lock = tmp_path / "lock" / "source.lock.json"
    write_lock(lock, pinned_lock_data())
    return {"remote": remote, "clone": clone, "lock": lock, "base": base, "head": head}


def test_fetch_pull_request_reads_head_and_merge_base(fork: dict[str, Any]) -> None:
    pr = fetch_pull_request(fork["clone"], 7, "refs/heads/main")
    assert (pr.head, pr.base) == (fork["head"], fork["base"])
    assert pr.head_tree == git(fork["remote"], "rev-parse", f"{fork['head']}^{{tree}}")
    assert pr.title == "Warm Kimi-K3 MLA transports at load"


def test_lock_pin_pr_pins_the_head_with_its_number(
    fork: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["lock", "pin", "--component", "vllm", "--pr", "7", "--repo", str(fork["clone"])]
    assert main([*argv, "--lock", str(fork["lock"])]) == 0
    vllm = json.loads(fork["lock"].read_text())["components"]["vllm"]
    assert vllm["source"]["ref"] == "refs/pull/7/head"
    assert vllm["source"]["commit"] == fork["head"]
    assert vllm["pull_requests"] == [
        {
            "number": 7,
            "head": fork["head"],
            "merge_commit": None,
            "title": "Warm Kimi-K3 MLA transports at load",
        }
    ]
    assert check_lock(fork["lock"]) == []
    assert "filled components.vllm.pull_requests" in capsys.readouterr().out


def test_lock_pin_pr_base_side_pins_where_the_pull_request_branched(fork: dict[str, Any]) -> None:
    pin_pull_request(fork["lock"], "vllm", fork["clone"], 7, "refs/heads/main", side="base")
    vllm = json.loads(fork["lock"].read_text())["components"]["vllm"]
    assert vllm["source"]["commit"] == fork["base"]
    assert vllm["source"]["ref"] == "refs/heads/main"
    assert vllm["pull_requests"] == []
    assert check_lock(fork["lock"]) == []


def test_a_recorded_pull_request_not_in_the_new_commit_refuses_the_pin(
    fork: dict[str, Any],
) -> None:
    pin_pull_request(fork["lock"], "vllm", fork["clone"], 7, "refs/heads/main")
    before = fork["lock"].read_bytes()
    # Pull request 9 branches from main without pull request 7's head.
    remote = fork["remote"]
    git(remote, "checkout", "-q", "-b", "pr9", fork["base"])
    head9 = _commit(remote, "other.py", "# other\n", "Other change")
    git(remote, "update-ref", "refs/pull/9/head", head9)
    with pytest.raises(UsageError, match=r"pull request 7 .* is not contained in"):
        pin_pull_request(fork["lock"], "vllm", fork["clone"], 9, "refs/heads/main")
    assert fork["lock"].read_bytes() == before
    # The checkout pin checks ancestry too: the clone's main does not contain PR 7.
    git(fork["clone"], "checkout", "-q", "main")
    with pytest.raises(UsageError, match=r"pull request 7 .* is not contained in"):
        pin_component(fork["lock"], "vllm", fork["clone"])
    assert fork["lock"].read_bytes() == before


@pytest.mark.parametrize(
    ("number", "base_ref", "needle"),
    [(8, "refs/heads/main", "refs/pull/8/head"), (7, "main", "must be a branch")],
)
def test_an_unknown_pull_request_or_base_is_one_line_exit_2(
    fork: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    number: int,
    base_ref: str,
    needle: str,
) -> None:
    before = fork["lock"].read_bytes()
    argv = ["lock", "pin", "--component", "vllm", "--pr", str(number), "--base-ref", base_ref]
    assert main([*argv, "--repo", str(fork["clone"]), "--lock", str(fork["lock"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert fork["lock"].read_bytes() == before


def test_pull_request_options_without_pr_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = write_lock(tmp_path / "source.lock.json", pinned_lock_data())
    repo = make_repo(tmp_path / "vllm", {"a.py": "a = 1\n"})
    argv = ["lock", "pin", "--component", "vllm", "--repo", str(repo), "--lock", str(lock)]
    assert main([*argv, "--side", "base"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "are for --pr" in err[0]
    assert json.loads(lock.read_text()) == pinned_lock_data()
