"""Build the source-locked image: arguments and labels from the lock, then the docker SDK.

The lock is the only place a pin is written. `build_args` turns it into the Dockerfile's build
arguments and `image_labels` into the labels the built image must carry; both are pure, and
`dockerfile_problems` proves the Dockerfile declares exactly those arguments (no defaults, all
used) and sets exactly those labels. `plan_build` gathers everything that can be checked without
an engine (lock pinned, Dockerfile agrees, harness tree clean); only then `run_build` connects,
sends a context of the harness's tracked files, streams progress, checks the labels on the result,
runs the in-image identity check in a container, and returns the `ImageIdentity` for the receipt.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import tarfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness import gitinfo
from harness.errors import DcpqualError, UsageError
from harness.image import dockerfile
from harness.image.lock import load_pinned_lock, lock_sha256
from harness.schema.base import first_error
from harness.schema.image import GitPin, ImageHarness, ImageIdentity, ImageRuntime
from harness.schema.lock import SourceLock

DEFAULT_LOCK = Path("images/kimi-k3-cu133-torch213/source.lock.json")
DEFAULT_IDENTITY_OUT = Path("build/image/identity.json")
COMPONENT_FIELDS = ("repository", "ref", "commit", "tree")
LABEL_PREFIX = "io.dcpqual"

Emit = Callable[[str], None]


class ImageBuildError(DcpqualError):
    """The engine ran the build and it failed, or produced something other than the lock."""

    exit_code = 1


def component_arg(name: str, field: str) -> str:
    """Build argument for one field of one component: SRC_<NAME>_<FIELD>."""
    return f"SRC_{re.sub(r'[^A-Za-z0-9]', '_', name).upper()}_{field.upper()}"


def build_args(lock: SourceLock, sha256: str, harness: gitinfo.GitIdentity) -> dict[str, str]:
    """The Dockerfile's build arguments, every one computed from the lock or the harness tree."""
    args = {
        "BASE_IMAGE": lock.base_image.pinned,
        "LOCK_SHA256": sha256,
        "LOCK_CUDA_VERSION": lock.versions.cuda,
        "LOCK_TORCH_VERSION": lock.versions.torch,
        "LOCK_NCCL_VERSION": lock.versions.nccl,
        "TORCH_CUDA_ARCH_LIST": lock.torch_cuda_arch_list,
        "HARNESS_COMMIT": harness.commit,
        "HARNESS_TREE": harness.tree,
        "HARNESS_DIRTY": "true" if harness.dirty else "false",
    }
    for name, comp in sorted(lock.components.items()):
        for field in COMPONENT_FIELDS:
            args[component_arg(name, field)] = getattr(comp.source, field)
    return args


def image_labels(lock: SourceLock, sha256: str, harness: gitinfo.GitIdentity) -> dict[str, str]:
    """The labels the built image must carry: lock sha256, versions, every commit and tree."""
    p = LABEL_PREFIX
    labels = {
        f"{p}.lock.sha256": sha256,
        f"{p}.base.image": lock.base_image.pinned,
        f"{p}.version.cuda": lock.versions.cuda,
        f"{p}.version.torch": lock.versions.torch,
        f"{p}.version.nccl": lock.versions.nccl,
        f"{p}.torch-cuda-arch-list": lock.torch_cuda_arch_list,
        f"{p}.harness.commit": harness.commit,
        f"{p}.harness.tree": harness.tree,
        f"{p}.harness.dirty": "true" if harness.dirty else "false",
        "org.opencontainers.image.revision": harness.commit,
    }
    for name, comp in sorted(lock.components.items()):
        for field in COMPONENT_FIELDS:
            labels[f"{p}.source.{name}.{field}"] = getattr(comp.source, field)
    return labels


def dockerfile_problems(text: str, args: Mapping[str, str], labels: Mapping[str, str]) -> list[str]:
    """Where the Dockerfile and the lock-derived arguments and labels disagree, one line each."""
    problems = []
    declared = dockerfile.declared_args(text)
    for name in sorted(set(args) - set(declared)):
        problems.append(
            f"build argument {name} is passed but the Dockerfile declares no ARG {name}"
        )
    for name in sorted(set(declared) - set(args)):
        problems.append(f"ARG {name} is declared but not computed from the lock")
    for name, default in sorted(declared.items()):
        if default is not None:
            problems.append(f"ARG {name} has a default ({default!r}); pins come from the lock only")
    problems += dockerfile.undeclared_uses(text, set(args))
    used = dockerfile.referenced_names(text)
    for name in sorted(set(declared) - used):
        problems.append(f"ARG {name} is declared but never used")
    try:
        found = dockerfile.labels(text, args)
    except (KeyError, ValueError) as exc:
        return [*problems, f"LABEL: {exc}"]
    for key in sorted(set(labels) | set(found)):
        if labels.get(key) != found.get(key):
            problems.append(
                f"label {key}: expected {labels.get(key)!r}, Dockerfile sets {found.get(key)!r}"
            )
    return problems


def context_tar(root: Path, files: Iterable[str]) -> bytes:
    """A reproducible tar of `files` under `root`: sorted, mtime 0, root-owned, modes kept."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(set(files)):
            path = root / name
            info = tar.gettarinfo(str(path), arcname=name)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isreg():
                info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


@dataclass(frozen=True)
class BuildPlan:
    """Everything a build needs, checked before any engine is contacted."""

    root: Path
    lock_path: Path  # relative to root
    dockerfile: Path  # relative to root
    tag: str
    lock: SourceLock
    lock_sha256: str
    harness: gitinfo.GitIdentity
    args: dict[str, str]
    labels: dict[str, str]
    context_files: tuple[str, ...]


def default_tag(lock: SourceLock, sha256: str) -> str:
    return f"dcpqual/{lock.image}:lock-{sha256[:12]}"


def plan_build(
    root: Path, lock_path: Path | None = None, tag: str | None = None, allow_dirty: bool = False
) -> BuildPlan:
    """Validate lock, Dockerfile and harness tree; raises UsageError before anything is built.

    `root` is the harness checkout (the build context); `lock_path` defaults to the image's lock
    inside it, and must lie inside it (the Dockerfile checks the lock's bytes in the context).
    """
    root = Path(root).resolve()
    full_lock = root / DEFAULT_LOCK if lock_path is None else Path(lock_path).resolve()
    try:
        rel_lock = full_lock.relative_to(root)
    except ValueError:
        raise UsageError(f"lock {full_lock} is outside the build context {root}") from None
    if rel_lock.name != DEFAULT_LOCK.name:
        raise UsageError(
            f"lock {rel_lock} must be named {DEFAULT_LOCK.name}, next to its Dockerfile"
        )
    lock = load_pinned_lock(root / rel_lock)
    sha = lock_sha256(root / rel_lock)
    rel_dockerfile = rel_lock.parent / "Dockerfile"
    if not (root / rel_dockerfile).is_file():
        raise UsageError(f"no Dockerfile next to the lock: {root / rel_dockerfile}")
    harness = gitinfo.identity(root)
    if harness.dirty and not allow_dirty:
        raise UsageError(
            f"harness tree {root} has uncommitted or untracked changes; commit them "
            "(the image records the harness commit and tree) or pass --allow-dirty"
        )
    args = build_args(lock, sha, harness)
    labels = image_labels(lock, sha, harness)
    problems = dockerfile_problems(dockerfile.read(root / rel_dockerfile), args, labels)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(f"{rel_dockerfile}: {problems[0]}{more}")
    image_dir = rel_lock.parent
    files = set(gitinfo.tracked_files(root))
    files.update(
        str(p.relative_to(root)) for p in (root / image_dir).iterdir() if p.is_file()
    )  # with --allow-dirty, an uncommitted lock still travels with its Dockerfile
    return BuildPlan(
        root=root,
        lock_path=rel_lock,
        dockerfile=rel_dockerfile,
        tag=tag or default_tag(lock, sha),
        lock=lock,
        lock_sha256=sha,
        harness=harness,
        args=args,
        labels=labels,
        context_files=tuple(sorted(files)),
    )


_SUCCESS = re.compile(r"Successfully built ([0-9a-f]{12,64})")


def consume_build_events(events: Iterable[Mapping[str, Any]], emit: Emit) -> str:
    """Stream the engine's build events to `emit`; return the image id, raise on an error event."""
    image_id: str | None = None
    short: str | None = None
    for event in events:
        if "error" in event or "errorDetail" in event:
            detail = event.get("errorDetail") or {}
            message = detail.get("message") or event.get("error") or "unknown error"
            raise ImageBuildError(f"build failed: {' '.join(str(message).split())}")
        if "stream" in event:
            for line in str(event["stream"]).splitlines():
                if line.strip():
                    emit(line.rstrip())
                    if found := _SUCCESS.search(line):
                        short = found.group(1)
        elif "status" in event:
            emit(" ".join(str(event[k]) for k in ("id", "status", "progress") if event.get(k)))
        aux = event.get("aux")
        if isinstance(aux, Mapping) and isinstance(aux.get("ID"), str):
            image_id = aux["ID"]
    if image_id is None and short is not None:
        image_id = short
    if image_id is None:
        raise ImageBuildError("the engine finished the build without reporting an image id")
    return image_id


def _utc_now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def identity_from(
    plan: BuildPlan, inspect: Mapping[str, Any], runtime: ImageRuntime | None, built_at: str
) -> ImageIdentity:
    """The receipt's image identity, from the plan, what the engine says about the image and
    the in-image check's report; an engine answer that does not fit it is an ImageBuildError."""
    image_id = str(inspect["Id"])
    repo_digests = [str(d) for d in inspect.get("RepoDigests") or ()]
    digest = repo_digests[0].rpartition("@")[2] if repo_digests else image_id
    labels = dict((inspect.get("Config") or {}).get("Labels") or {})
    try:
        return ImageIdentity(
            reference=plan.tag,
            image_id=image_id,
            digest=digest,
            repo_digests=repo_digests,
            image=plan.lock.image,
            lock_path=str(plan.lock_path),
            source_lock_sha256=plan.lock_sha256,
            base_image=plan.lock.base_image.pinned,
            versions=plan.lock.versions.model_dump(),
            torch_cuda_arch_list=plan.lock.torch_cuda_arch_list,
            sources={
                name: GitPin(**comp.source.model_dump())
                for name, comp in sorted(plan.lock.components.items())
            },
            harness=ImageHarness(
                commit=plan.harness.commit, tree=plan.harness.tree, dirty=plan.harness.dirty
            ),
            labels=labels,
            built_at=built_at,
            runtime=runtime,
        )
    except ValidationError as exc:
        raise ImageBuildError(
            f"the built image's identity is not valid: {first_error(exc)}"
        ) from None


def label_mismatches(expected: Mapping[str, str], found: Mapping[str, str]) -> list[str]:
    return [
        f"label {key}: expected {value!r}, image has {found.get(key)!r}"
        for key, value in sorted(expected.items())
        if found.get(key) != value
    ]


def check_in_image(client: Any, image_id: str) -> ImageRuntime:
    """Run `verify_runtime --json` in a throwaway container (no GPU needed); its report (one
    that is not JSON, or not the report's model, is an ImageBuildError)."""
    container = client.containers.run(
        image_id,
        ["python", "-m", "harness.image.verify_runtime", "--json"],
        detach=True,
        privileged=False,
    )
    try:
        status = container.wait()
        out = container.logs(stdout=True, stderr=False).decode("utf-8", errors="replace")
    finally:
        container.remove(force=True)
    try:
        report = json.loads(out)
    except json.JSONDecodeError:
        code = status.get("StatusCode")
        raise ImageBuildError(f"in-image check printed no JSON report (exit {code})") from None
    try:
        return ImageRuntime.model_validate(report)
    except ValidationError as exc:
        raise ImageBuildError(
            f"the in-image check's report is not valid: {first_error(exc)}"
        ) from None


def run_build(plan: BuildPlan, client: Any, emit: Emit) -> ImageIdentity:
    """Build `plan` on the engine behind `client`; check labels and run the in-image check."""
    context = context_tar(plan.root, plan.context_files)
    emit(
        f"building {plan.tag} from {plan.lock_path} (sha256 {plan.lock_sha256}), "
        f"context {len(plan.context_files)} files, {len(context) // 1024} KiB"
    )
    events = client.api.build(
        fileobj=io.BytesIO(context),
        custom_context=True,
        dockerfile=str(plan.dockerfile),
        tag=plan.tag,
        buildargs=plan.args,
        rm=True,
        forcerm=True,
        pull=False,  # the base is pinned by digest; the engine fetches exactly that
        decode=True,
        timeout=None,  # a from-source torch build takes hours
    )
    image_id = consume_build_events(events, emit)
    inspect = client.api.inspect_image(image_id)
    found = (inspect.get("Config") or {}).get("Labels") or {}
    if wrong := label_mismatches(plan.labels, found):
        raise ImageBuildError(f"built image {inspect['Id']} does not carry the lock: {wrong[0]}")
    emit(f"built {inspect['Id']}; running the in-image identity check")
    runtime = check_in_image(client, str(inspect["Id"]))
    return identity_from(plan, inspect, runtime, _utc_now())
