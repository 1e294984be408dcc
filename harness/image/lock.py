"""The source lock: what every component of the image is built from, pinned by commit and tree.

A lock (`images/<image>/source.lock.json`) looks like::

    {
      "schema": "dcpqual-source-lock/v1",
      "image": "kimi-k3-cu133-torch213",
      "base_image": {"reference": "nvidia/cuda:13.3.0-...", "digest": "sha256:<64 hex>"},
      "versions": {"cuda": "13.3", "torch": "2.13.0", "nccl": "2.28.9"},
      "torch_cuda_arch_list": "12.0a",
      "components": {
        "<name>": {
          "source": {"repository": URL, "ref": "refs/tags/..", "commit": 40hex, "tree": 40hex},
          "upstream_base": {"repository": URL, "ref": "refs/..", "commit": 40hex} | null,
          "pull_requests": [
            {"number": N, "head": 40hex, "merge_commit": 40hex | null, "title": ".."}
          ],
          "source_patches": []
        }
      }
    }

Two levels of checking, because the shipped lock is a template: `load_lock` checks the *shape*
(pydantic; placeholders allowed, so `pin_component` can fill them), `check_lock` checks that the
lock actually *pins* something (40-hex commits and trees, sha256 digests, no placeholders, no
branch-only refs, the versions this image is for). `lock_sha256` is over the file's bytes: the
same bytes that sit in the build context and that the image's labels name.
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

# What this image is, by its name (kimi-k3-cu133-torch213): a lock for anything else is wrong.
REQUIRED_CUDA = "13.3"
REQUIRED_TORCH = "2.13.0"
REQUIRED_ARCH_LIST = "12.0a"
REQUIRED_COMPONENTS = ("nccl", "pytorch", "vllm", "b12x")

# Whole-value patterns, always used with fullmatch: `$` would also accept a trailing newline.
HEX40 = re.compile(r"[0-9a-f]{40}")
SHA256_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
VERSION3 = re.compile(r"\d+\.\d+\.\d+")
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
    for i, pr in enumerate(comp.pull_requests):
        _hex40(p, f"{at}.pull_requests.{i}.head", pr.head, "head")
        if pr.merge_commit is not None:
            _hex40(p, f"{at}.pull_requests.{i}.merge_commit", pr.merge_commit, "merge_commit")
        if not pr.title.strip():
            p.add(f"{at}.pull_requests.{i}.title", "title is empty")
    if comp.source_patches:
        p.add(
            f"{at}.source_patches",
            f"{len(comp.source_patches)} patch(es); carry changes as commits on the source instead",
        )


def check_lock(path: Path) -> list[str]:
    """Every reason the lock at `path` does not pin the image, one line each; [] when it does."""
    raw, lock, problems = _parse(Path(path))
    if lock is None:
        return problems
    assert raw is not None
    p = _Problems()
    base = lock.base_image
    if "@" in base.reference:
        p.add("base_image.reference", "carries a digest; put it in base_image.digest only")
    if not SHA256_DIGEST.fullmatch(base.digest):
        p.add(
            "base_image.digest",
            f"tag {base.reference!r} has no sha256: digest (found {base.digest!r})",
        )
    v = lock.versions
    if v.cuda != REQUIRED_CUDA:
        p.add("versions.cuda", f"{v.cuda!r}, this image is for CUDA {REQUIRED_CUDA}")
    if v.torch != REQUIRED_TORCH:
        p.add("versions.torch", f"{v.torch!r}, this image is for PyTorch {REQUIRED_TORCH}")
    if not is_placeholder(v.nccl) and not VERSION3.fullmatch(v.nccl):
        p.add("versions.nccl", f"{v.nccl!r} is not a MAJOR.MINOR.PATCH version")
    if lock.torch_cuda_arch_list != REQUIRED_ARCH_LIST:
        p.add(
            "torch_cuda_arch_list",
            f"{lock.torch_cuda_arch_list!r}, this image is for {REQUIRED_ARCH_LIST} (sm_120)",
        )
    tag = base.reference.rsplit("/", 1)[-1].partition(":")[2]
    if tag and not is_placeholder(tag) and not tag.startswith(f"{REQUIRED_CUDA}."):
        p.add("base_image.reference", f"tag {tag!r} is not a CUDA {REQUIRED_CUDA} image")
    for name in REQUIRED_COMPONENTS:
        if name not in lock.components:
            p.add(f"components.{name}", "missing")
    for name, comp in lock.components.items():
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            p.add(f"components.{name}", "name must match [a-z][a-z0-9_]* (it becomes a build arg)")
        _check_component(p, name, comp, v)
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


def pin_component(lock_path: Path, name: str, repo_path: Path) -> PinResult:
    """Fill `name`'s commit and tree (and placeholders git can answer) from a clean checkout.

    Refuses a dirty checkout, and a checkout whose HEAD is not what the lock's ref names there;
    writes the lock atomically, or not at all.
    """
    lock_path, repo_path = Path(lock_path), Path(repo_path)
    raw, lock, problems = _parse(lock_path)
    if lock is None or raw is None:
        raise LockError(lock_path, problems)
    if name not in lock.components:
        known = ", ".join(sorted(lock.components)) or "none"
        raise UsageError(f"{lock_path}: no component {name!r} (components: {known})")
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
