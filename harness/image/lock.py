"""The source lock: what every component of the image is built from, pinned by commit and tree.

A lock (`images/<image>/source.lock.json`, schema "dcpqual-source-lock/v2"; fields described in
`harness.schema.lock` and `schemas/source-lock.json`) says what the image builds on
(`foundation`: a CUDA devel image with NCCL and PyTorch built from source, or a prebuilt
foundation image pinned by digest and labels), the versions it is for (data: CUDA 13.3 / torch
2.13 today, 13.4.1 / 2.14 tomorrow), the Python pins it decides and why, where b12x comes from,
the build's caps, the source gates, and per component `source {repository, ref, commit, tree}`,
`upstream_base`, `pull_requests [{number, head, merge_commit, title}]`, `source_patches: []`.

Two levels of checking, because the shipped lock is a template: `load_lock` checks the *shape*
(pydantic; placeholders allowed, so `pin_component` can fill them), `check_lock` checks that the
lock actually *pins* something (40-hex commits and trees, sha256 digests, no placeholders, no
branch-only refs, versions that agree with the image's name and the components). `lock_sha256`
is over the file's bytes: the same bytes that sit in the build context and that the image's
labels name.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness import gitinfo
from harness.atomic import atomic_write_text
from harness.errors import UsageError
from harness.jsonfile import JsonSyntaxError, read_json
from harness.schema.lock import (
    Component,
    SourceLock,
    Versions,
)

# Components the foundation builds from source (kind "source") or already carries ("image").
FOUNDATION_COMPONENTS = ("nccl", "pytorch")

# Whole-value patterns, always used with fullmatch: `$` would also accept a trailing newline.
HEX40 = re.compile(r"[0-9a-f]{40}")
SHA256_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
VERSION3 = re.compile(r"\d+\.\d+\.\d+")
# A release or pre-release version as wheels name it: 2.13.0, 2.14.0a0, 2.14.0.dev20260101.
VERSION = re.compile(r"\d+\.\d+\.\d+(?:(?:a|b|rc|\.dev|\.post)\d+)*")
CUDA_VERSION = re.compile(r"\d+\.\d+")  # MAJOR.MINOR, as nvcc and torch.version.cuda say it
ARCH_LIST = re.compile(r"\d+\.\d+[af]?(?:;\d+\.\d+[af]?)*(?:\+PTX)?")
DIST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?:\[[A-Za-z0-9._,-]+\])?")
TOOLCHAIN = re.compile(r"\d+\.\d+(?:\.\d+)?")
REPOSITORY = re.compile(r"(?:https://|ssh://|git@)\S+")
MAX_LOCK_BYTES = 1 << 20  # a lock is a few KiB
PLACEHOLDER = re.compile(r"<[^<>]*>|\b(?:TODO|FIXME|TBD|XXX|CHANGEME|PLACEHOLDER)\b")
QUALIFIED_REF = ("refs/tags/", "refs/heads/", "refs/pull/")


class LockError(UsageError):
    """A lock that cannot be used; `problems` holds every reason, one line each."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        more = f" (and {len(problems) - 1} more; see `dcpqual lock check {path}`)"
        super().__init__(f"{path}: {problems[0]}{more if len(problems) > 1 else ''}")


@dataclass(frozen=True)
class PinResult:
    """What `pin_component` wrote: the component's identity and every field it filled."""

    component: str
    commit: str
    tree: str
    filled: tuple[str, ...]


def lock_sha256(path: Path) -> str:
    """sha256 (hex) of the lock file's bytes, as `sha256sum` prints it."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _read_raw(path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The lock's JSON object; a FIFO, device, huge or deep file is refused (exit 2) unread."""
    if not Path(path).exists():
        return None, ["cannot read the lock: No such file or directory"]
    try:
        raw = read_json(path, max_bytes=MAX_LOCK_BYTES)
    except JsonSyntaxError as exc:
        return None, [f"not valid JSON: {exc}"]
    if not isinstance(raw, dict):
        return None, [f"top level must be a JSON object, not {type(raw).__name__}"]
    return raw, []


def _shape_problems(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"{where}: {err['msg']}")
    return lines


def _parse(path: Path) -> tuple[dict[str, Any] | None, SourceLock | None, list[str]]:
    raw, problems = _read_raw(path)
    if raw is None:
        return None, None, problems
    try:
        return raw, SourceLock.model_validate(raw), []
    except ValidationError as exc:
        return raw, None, _shape_problems(exc)


def load_lock(path: Path) -> SourceLock:
    """The lock's shape, validated; placeholders are allowed (templates load)."""
    _, lock, problems = _parse(Path(path))
    if lock is None:
        raise LockError(Path(path), problems)
    return lock


def load_pinned_lock(path: Path) -> SourceLock:
    """A lock that passes `check_lock`; anything less raises `LockError` with every problem."""
    problems = check_lock(Path(path))
    if problems:
        raise LockError(Path(path), problems)
    return load_lock(Path(path))


def is_placeholder(value: str) -> bool:
    return bool(PLACEHOLDER.search(value))


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{where}.{i}")


class _Problems:
    """Problems keyed by field path, first reason wins, so one cause yields one line."""

    def __init__(self) -> None:
        self._by_path: dict[str, str] = {}

    def add(self, where: str, message: str) -> None:
        self._by_path.setdefault(where, f"{where}: {message}")

    def lines(self) -> list[str]:
        return list(self._by_path.values())


def _hex40(p: _Problems, where: str, value: str, what: str) -> None:
    if not HEX40.fullmatch(value):
        p.add(where, f"{what} {value!r} is not a 40-hex git object id")


def _ref(p: _Problems, where: str, ref: str, commit: str) -> None:
    if is_placeholder(ref):
        return  # the placeholder sweep names it
    if not ref.startswith(QUALIFIED_REF):
        p.add(where, f"ref {ref!r} is ambiguous; use refs/tags/NAME or refs/heads/NAME")
    elif ref.startswith("refs/heads/") and not HEX40.fullmatch(commit):
        p.add(where, f"ref {ref!r} is a branch and no commit pins it")


def _repository(p: _Problems, where: str, url: str) -> None:
    if not is_placeholder(url) and not REPOSITORY.fullmatch(url):
        p.add(where, f"repository {url!r} is not an https://, ssh:// or git@ URL")


def _check_component(p: _Problems, name: str, comp: Component, versions: Versions) -> None:
    at = f"components.{name}"
    src = comp.source
    _repository(p, f"{at}.source.repository", src.repository)
    _ref(p, f"{at}.source.ref", src.ref, src.commit)
    _hex40(p, f"{at}.source.commit", src.commit, "commit")
    _hex40(p, f"{at}.source.tree", src.tree, "tree")
    if (
        name == "pytorch"
        and not is_placeholder(src.ref)
        and src.ref != f"refs/tags/v{versions.torch}"
    ):
        p.add(f"{at}.source.ref", f"ref {src.ref!r} is not refs/tags/v{versions.torch}")
    if (
        name == "nccl"
        and VERSION3.fullmatch(versions.nccl)
        and not is_placeholder(src.ref)
        and not src.ref.startswith(f"refs/tags/v{versions.nccl}")
    ):
        p.add(f"{at}.source.ref", f"ref {src.ref!r} is not the tag of NCCL {versions.nccl}")
    if comp.upstream_base is not None:
        base = comp.upstream_base
        _repository(p, f"{at}.upstream_base.repository", base.repository)
        _ref(p, f"{at}.upstream_base.ref", base.ref, base.commit)
        _hex40(p, f"{at}.upstream_base.commit", base.commit, "commit")
    numbers: set[int] = set()
    for i, pr in enumerate(comp.pull_requests):
        _hex40(p, f"{at}.pull_requests.{i}.head", pr.head, "head")
        if pr.merge_commit is not None:
            _hex40(p, f"{at}.pull_requests.{i}.merge_commit", pr.merge_commit, "merge_commit")
        if not pr.title.strip():
            p.add(f"{at}.pull_requests.{i}.title", "title is empty")
        if pr.number in numbers:
            p.add(f"{at}.pull_requests.{i}.number", f"pull request {pr.number} is listed twice")
        numbers.add(pr.number)
    pull = re.fullmatch(r"refs/pull/(\d+)/head", src.ref)
    if pull is not None:
        number = int(pull.group(1))
        named = [pr for pr in comp.pull_requests if pr.number == number]
        if not named:
            p.add(f"{at}.pull_requests", f"ref {src.ref} names pull request {number}; record it")
        elif named[0].head != src.commit:
            p.add(
                f"{at}.source.commit",
                f"ref {src.ref} is built at {src.commit}, not its recorded head {named[0].head}",
            )
    if comp.source_patches:
        p.add(
            f"{at}.source_patches",
            f"{len(comp.source_patches)} patch(es); carry changes as commits on the source instead",
        )


def _check_versions(p: _Problems, lock: SourceLock) -> None:
    """The versions are well-formed and agree with the image's name (kimi-k3-cu133-torch213)."""
    v = lock.versions
    shapes = (
        ("cuda", CUDA_VERSION, "MAJOR.MINOR"),
        ("torch", VERSION, "MAJOR.MINOR.PATCH (pre-release suffix allowed)"),
        ("nccl", VERSION3, "MAJOR.MINOR.PATCH"),
        ("triton", VERSION, "MAJOR.MINOR.PATCH (pre-release suffix allowed)"),
        ("torch_cuda_arch_list", ARCH_LIST, "an arch list such as 12.0a"),
    )
    for key, pattern, what in shapes:
        value = getattr(v, key)
        if not is_placeholder(value) and not pattern.fullmatch(value):
            p.add(f"versions.{key}", f"{value!r} is not {what}")
    cu = re.search(r"cu(\d{3,})", lock.image)
    if cu and CUDA_VERSION.fullmatch(v.cuda) and cu.group(1) != v.cuda.replace(".", ""):
        p.add("versions.cuda", f"{v.cuda!r}, the image {lock.image!r} is for cu{cu.group(1)}")
    torch = re.search(r"torch(\d{3,})", lock.image)
    if torch and VERSION.fullmatch(v.torch):
        major_minor = "".join(v.torch.split(".")[:2])
        if torch.group(1) != major_minor:
            p.add(
                "versions.torch",
                f"{v.torch!r}, the image {lock.image!r} is for torch{torch.group(1)}",
            )


def _check_foundation(p: _Problems, lock: SourceLock) -> None:
    f = lock.foundation
    image = f.image
    if "@" in image.reference:
        p.add("foundation.image.reference", "carries a digest; put it in foundation.image.digest")
    if not SHA256_DIGEST.fullmatch(image.digest):
        p.add(
            "foundation.image.digest",
            f"tag {image.reference!r} has no sha256: digest (found {image.digest!r})",
        )
    v = lock.versions
    if f.kind == "source":
        tag = image.reference.rsplit("/", 1)[-1].partition(":")[2]
        if tag and not is_placeholder(tag) and not tag.startswith(f"{v.cuda}."):
            p.add("foundation.image.reference", f"tag {tag!r} is not a CUDA {v.cuda} image")
        if f.labels:
            p.add(
                "foundation.labels", "a from-source foundation is built here; it asserts no labels"
            )
        for name in FOUNDATION_COMPONENTS:
            if name not in lock.components:
                p.add(f"components.{name}", "missing (the foundation is built from source)")
        return
    if not f.labels:
        p.add(
            "foundation.labels", "a prebuilt foundation must be held to labels naming its versions"
        )
    for name in FOUNDATION_COMPONENTS:
        if name in lock.components:
            p.add(
                f"components.{name}",
                "the prebuilt foundation carries it; remove it or build from source",
            )
    values = set(f.labels.values())
    for key in ("cuda", "torch", "nccl"):
        want = getattr(v, key)
        if not any(
            value == want or value.startswith(f"{want}.") or value.startswith(f"{want}+")
            for value in values
        ):
            p.add("foundation.labels", f"no label says {key} {want}")


def _check_b12x(p: _Problems, lock: SourceLock) -> None:
    b = lock.b12x_from
    if b.kind == "repository":
        if "b12x" not in lock.components:
            p.add("components.b12x", "missing (b12x_from.kind is repository)")
        if b.flashinfer_version is not None or b.index_url is not None:
            p.add("b12x_from", "flashinfer_version and index_url are for kind flashinfer-python")
        return
    if "b12x" in lock.components:
        p.add("components.b12x", "b12x comes from flashinfer-python; remove the component")
    if b.flashinfer_version is None or not VERSION.fullmatch(b.flashinfer_version):
        p.add("b12x_from.flashinfer_version", f"{b.flashinfer_version!r} is not an exact version")
    if b.index_url is None or not b.index_url.startswith("https://"):
        p.add("b12x_from.index_url", f"{b.index_url!r} is not an https:// index")


def _check_pins_and_gates(p: _Problems, lock: SourceLock) -> None:
    seen: set[str] = set()
    for i, pin in enumerate(lock.python_pins):
        at = f"python_pins.{i}"
        if not DIST_NAME.fullmatch(pin.name):
            p.add(f"{at}.name", f"{pin.name!r} is not a distribution name")
        base = pin.name.partition("[")[0].lower().replace("_", "-")
        if base in seen:
            p.add(f"{at}.name", f"{base} is pinned twice")
        seen.add(base)
        if not is_placeholder(pin.version) and not VERSION.fullmatch(pin.version):
            p.add(f"{at}.version", f"{pin.version!r} is not an exact version")
        if not pin.why.strip():
            p.add(f"{at}.why", "a pin the lock decides says why")
    for i, gate in enumerate(lock.source_gates):
        at = f"source_gates.{i}"
        if gate.component not in lock.components:
            p.add(f"{at}.component", f"{gate.component!r} is not a component of this lock")
        for j, test in enumerate(gate.tests):
            if test.startswith(("/", "-")) or ".." in test.split("::")[0].split("/"):
                p.add(f"{at}.tests.{j}", f"{test!r} is not a test id inside the tree")
    vb = lock.vllm_build
    for key in ("build_requirements", "runtime_requirements"):
        value = getattr(vb, key)
        parts = value.split("/")
        if parts[0] != "requirements" or ".." in parts or not value.endswith(".txt"):
            p.add(f"vllm_build.{key}", f"{value!r} is not a requirements/*.txt file of the fork")
    if not is_placeholder(vb.rust_toolchain) and not TOOLCHAIN.fullmatch(vb.rust_toolchain):
        p.add("vllm_build.rust_toolchain", f"{vb.rust_toolchain!r} is not a toolchain version")


def check_lock(path: Path) -> list[str]:
    """Every reason the lock at `path` does not pin the image, one line each; [] when it does."""
    raw, lock, problems = _parse(Path(path))
    if lock is None:
        return problems
    assert raw is not None
    p = _Problems()
    _check_foundation(p, lock)
    _check_versions(p, lock)
    _check_b12x(p, lock)
    _check_pins_and_gates(p, lock)
    if "vllm" not in lock.components:
        p.add("components.vllm", "missing")
    for name, comp in lock.components.items():
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            p.add(f"components.{name}", "name must match [a-z][a-z0-9_]* (it becomes a build arg)")
        _check_component(p, name, comp, lock.versions)
    for where, value in _strings(raw, ""):
        if is_placeholder(value):
            p.add(where, f"placeholder {value!r} is not pinned")
    return p.lines()


# ---------------------------------------------------------------------------------------------
# lock pin


def write_json_atomic(path: Path, data: Any) -> None:
    """Replace `path` with `data` as indented JSON, keeping the file's permissions."""
    path = Path(path)
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    atomic_write_text(path, text, mode=mode)


def _nccl_version(repo: Path) -> str | None:
    mk = repo / "makefiles" / "version.mk"
    if not mk.is_file():
        return None
    fields = dict(re.findall(r"^NCCL_(MAJOR|MINOR|PATCH)\s*:?=\s*(\d+)", mk.read_text(), re.M))
    if len(fields) != 3:
        return None
    return f"{fields['MAJOR']}.{fields['MINOR']}.{fields['PATCH']}"


def _torch_version(repo: Path) -> str | None:
    txt = repo / "version.txt"
    if not txt.is_file():
        return None
    found = re.match(r"\d+\.\d+\.\d+", txt.read_text().strip())
    return found.group(0) if found else None


# Component name -> (versions key, probe reading that version from the checkout).
VERSION_PROBES = {"nccl": ("nccl", _nccl_version), "pytorch": ("torch", _torch_version)}


def _head_ref(repo: Path) -> str | None:
    """A fully qualified ref for HEAD: an exact tag if one points at it, else the branch."""
    for cmd in (("describe", "--exact-match", "--tags", "HEAD"), ("symbolic-ref", "-q", "HEAD")):
        try:
            name = gitinfo.git(repo, *cmd)
        except UsageError:
            continue
        if name:
            return name if name.startswith("refs/") else f"refs/tags/{name}"
    return None


def _origin_url(repo: Path) -> str | None:
    try:
        url = gitinfo.git(repo, "remote", "get-url", "origin")
    except UsageError:
        return None
    return url if REPOSITORY.fullmatch(url) else None


def _lock_with_component(lock_path: Path, name: str) -> dict[str, Any]:
    """The lock's raw JSON, refused (LockError/UsageError) unless it parses as a lock and has
    component `name`: what every pin starts from."""
    raw, lock, problems = _parse(lock_path)
    if lock is None or raw is None:
        raise LockError(lock_path, problems)
    if name not in lock.components:
        known = ", ".join(sorted(lock.components)) or "none"
        raise UsageError(f"{lock_path}: no component {name!r} (components: {known})")
    return raw


def pin_component(lock_path: Path, name: str, repo_path: Path) -> PinResult:
    """Fill `name`'s commit and tree (and placeholders git can answer) from a clean checkout.

    Refuses a dirty checkout, and a checkout whose HEAD is not what the lock's ref names there;
    writes the lock atomically, or not at all.
    """
    lock_path, repo_path = Path(lock_path), Path(repo_path)
    raw = _lock_with_component(lock_path, name)
    ident = gitinfo.identity(repo_path)
    if ident.dirty:
        raise UsageError(f"{repo_path} has uncommitted or untracked changes; pin a clean checkout")
    entry = raw["components"][name]
    src = entry["source"]
    filled: list[str] = []
    at = f"components.{name}"

    ref = src["ref"]
    if is_placeholder(ref):
        head_ref = _head_ref(repo_path)
        if head_ref is None:
            raise UsageError(f"{at}.source.ref is a placeholder and HEAD of {repo_path} has no ref")
        src["ref"] = head_ref
        filled.append(f"{at}.source.ref")
    else:
        named = gitinfo.resolve_commit(repo_path, ref)
        if named is not None and named != ident.commit:
            raise UsageError(
                f"{repo_path}: HEAD is {ident.commit} but {ref} is {named}; check out {ref} first"
            )
    if is_placeholder(src["repository"]) and (url := _origin_url(repo_path)):
        src["repository"] = url
        filled.append(f"{at}.source.repository")
    for pr in entry["pull_requests"]:
        if HEX40.fullmatch(str(pr.get("head", ""))) and not is_ancestor(
            repo_path, pr["head"], ident.commit
        ):
            raise UsageError(
                f"{at}: pull request {pr['number']} (head {pr['head']}) is not contained in "
                f"{ident.commit}; the lock records it as merged"
            )
    for key, value in (("commit", ident.commit), ("tree", ident.tree)):
        if src[key] != value:
            src[key] = value
            filled.append(f"{at}.source.{key}")

    if name in VERSION_PROBES:
        key, probe = VERSION_PROBES[name]
        found = probe(repo_path)
        locked = raw["versions"][key]
        if found is not None and is_placeholder(locked):
            raw["versions"][key] = found
            filled.append(f"versions.{key}")
        elif found is not None and found != locked:
            raise UsageError(
                f"{repo_path} is {name} {found}, the lock says versions.{key}={locked}"
            )

    upstream = entry.get("upstream_base")
    if isinstance(upstream, dict) and is_placeholder(upstream.get("commit", "")):
        base_ref = upstream.get("ref", "")
        if not is_placeholder(base_ref) and gitinfo.resolve_commit(repo_path, base_ref):
            upstream["commit"] = gitinfo.git(repo_path, "merge-base", "HEAD", base_ref)
            filled.append(f"{at}.upstream_base.commit")

    try:
        SourceLock.model_validate(raw)
    except ValidationError as exc:  # pragma: no cover - we only write strings we validated
        raise LockError(lock_path, _shape_problems(exc)) from None
    write_json_atomic(lock_path, raw)
    return PinResult(component=name, commit=ident.commit, tree=ident.tree, filled=tuple(filled))


# ---------------------------------------------------------------------------------------------
# pull requests: pin a fork pull request's head (or its base), verified by ancestry


@dataclass(frozen=True)
class PullRequestPin:
    """A pull request as fetched from the component's remote: its head, and the commit its base
    ref and head have in common (what the pull request is qualified against)."""

    number: int
    head: str
    head_tree: str
    base_ref: str
    base: str
    base_tree: str
    title: str


def is_ancestor(repo: Path, ancestor: str, commit: str) -> bool:
    """True when `ancestor` is `commit` or reachable from it (git merge-base --is-ancestor)."""
    try:
        gitinfo.git(repo, "merge-base", "--is-ancestor", ancestor, commit)
    except UsageError:
        return False
    return True


def fetch_pull_request(
    repo_path: Path, number: int, base_ref: str, remote: str = "origin"
) -> PullRequestPin:
    """Fetch `refs/pull/N/head` and `base_ref` from `remote` into `repo_path` (a clone of the
    fork; nothing in its working tree changes) and read their commits, trees and merge-base."""
    if number < 1:
        raise UsageError(f"pull request number must be 1 or more, not {number}")
    if not base_ref.startswith("refs/heads/"):
        raise UsageError(f"base ref {base_ref!r} must be a branch, refs/heads/NAME")
    repo = Path(repo_path)
    local_head = f"refs/dcpqual/pull/{number}/head"
    local_base = f"refs/dcpqual/pull/{number}/base"
    gitinfo.git(
        repo,
        "fetch",
        "--quiet",
        "--no-tags",
        remote,
        f"+refs/pull/{number}/head:{local_head}",
        f"+{base_ref}:{local_base}",
    )
    head = gitinfo.git(repo, "rev-parse", "--verify", f"{local_head}^{{commit}}")
    tip = gitinfo.git(repo, "rev-parse", "--verify", f"{local_base}^{{commit}}")
    try:
        base = gitinfo.git(repo, "merge-base", head, tip)
    except UsageError:
        raise UsageError(
            f"pull request {number}'s head {head} shares no history with {base_ref}"
        ) from None
    return PullRequestPin(
        number=number,
        head=head,
        head_tree=gitinfo.git(repo, "rev-parse", f"{head}^{{tree}}"),
        base_ref=base_ref,
        base=base,
        base_tree=gitinfo.git(repo, "rev-parse", f"{base}^{{tree}}"),
        title=gitinfo.git(repo, "log", "-1", "--format=%s", head) or f"pull request {number}",
    )


def pin_pull_request(
    lock_path: Path,
    name: str,
    repo_path: Path,
    number: int,
    base_ref: str,
    side: str = "head",
    title: str | None = None,
    expect_head: str | None = None,
) -> PinResult:
    """Pin component `name` to pull request `number`'s head (`side="head"`: ref
    refs/pull/N/head, the pull request recorded with its head) or to the commit it branched from
    on `base_ref` (`side="base"`: no pull request). Every pull request already recorded must
    still be contained in the pinned commit (ancestry), else nothing is written; with
    `expect_head`, the fetched head must be that commit (the one a person reviewed)."""
    if side not in ("head", "base"):
        raise UsageError(f"side must be head or base, not {side!r}")
    lock_path, repo_path = Path(lock_path), Path(repo_path)
    raw = _lock_with_component(lock_path, name)
    pr = fetch_pull_request(repo_path, number, base_ref)
    if expect_head is not None and pr.head != expect_head:
        raise UsageError(
            f"pull request {number}'s head is {pr.head}, not the reviewed {expect_head}"
        )
    entry = raw["components"][name]
    src = entry["source"]
    at = f"components.{name}"
    commit, tree = (pr.head, pr.head_tree) if side == "head" else (pr.base, pr.base_tree)
    kept = []
    for old in entry["pull_requests"]:
        if old["number"] == number:
            continue
        if not is_ancestor(repo_path, old["head"], commit):
            raise UsageError(
                f"{at}: pull request {old['number']} (head {old['head']}) is not contained in "
                f"{commit}; remove it from the lock or merge it first"
            )
        kept.append(old)
    if side == "head":
        kept.append(
            {"number": number, "head": pr.head, "merge_commit": None, "title": title or pr.title}
        )
        ref = f"refs/pull/{number}/head"
    else:
        ref = base_ref
    filled = [f"{at}.source.ref", f"{at}.source.commit", f"{at}.source.tree"]
    src.update(ref=ref, commit=commit, tree=tree)
    if is_placeholder(src["repository"]) and (url := _origin_url(repo_path)):
        src["repository"] = url
        filled.append(f"{at}.source.repository")
    entry["pull_requests"] = kept
    filled.append(f"{at}.pull_requests")
    upstream = entry.get("upstream_base")
    base_ref_up = upstream.get("ref", "") if isinstance(upstream, dict) else ""
    if (
        base_ref_up
        and not is_placeholder(base_ref_up)
        and gitinfo.resolve_commit(repo_path, base_ref_up)
    ):
        assert isinstance(upstream, dict)
        upstream["commit"] = gitinfo.git(repo_path, "merge-base", commit, base_ref_up)
        filled.append(f"{at}.upstream_base.commit")
    try:
        SourceLock.model_validate(raw)
    except ValidationError as exc:  # pragma: no cover - we only write strings we validated
        raise LockError(lock_path, _shape_problems(exc)) from None
    write_json_atomic(lock_path, raw)
    return PinResult(component=name, commit=commit, tree=tree, filled=tuple(filled))
