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

import dataclasses
import datetime as dt
import hashlib
import io
import json
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness import gitinfo
from harness.errors import DcpqualError, UsageError
from harness.image import dockerfile
from harness.image.lock import FOUNDATION_COMPONENTS, load_pinned_lock, lock_sha256
from harness.schema.base import first_error
from harness.schema.image import GitPin, ImageHarness, ImageIdentity, ImageRuntime
from harness.schema.lock import Component, SourceLock

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


def pull_requests_arg(comp: Component | None) -> str:
    """`number:head` of each recorded pull request, space separated (fetch-source checks each
    head is an ancestor of the commit built)."""
    if comp is None:
        return ""
    return " ".join(f"{pr.number}:{pr.head}" for pr in comp.pull_requests)


def arch_numbers(arch_list: str) -> list[str]:
    """ "12.0a" -> ["120"]: the compute capabilities of an arch list, without suffixes."""
    out = []
    for item in arch_list.replace("+PTX", "").split(";"):
        major, _, minor = item.strip().partition(".")
        out.append(major + re.sub(r"\D", "", minor))
    return out


def nccl_gencode(arch_list: str) -> str:
    """NCCL's NVCC_GENCODE: a cubin for every arch of the list and the PTX of the newest (the
    community builds NCCL for compute_120/sm_120 plus PTX, checked with cuobjdump)."""
    numbers = arch_numbers(arch_list)
    codes = [f"-gencode=arch=compute_{n},code=sm_{n}" for n in numbers]
    return " ".join([*codes, f"-gencode=arch=compute_{numbers[-1]},code=compute_{numbers[-1]}"])


def foundation_key(lock: SourceLock) -> str:
    """Identity of a from-source foundation: everything Dockerfile.foundation consumes. Locks
    that change only the fork or b12x share it, so the hours of NCCL and torch are paid once."""
    part = {
        "foundation": lock.foundation.model_dump(mode="json"),
        "versions": lock.versions.model_dump(mode="json"),
        "max_jobs": lock.build.max_jobs,
        "nvcc_threads": lock.build.nvcc_threads,
        "components": {
            n: lock.components[n].model_dump(mode="json")
            for n in FOUNDATION_COMPONENTS
            if n in lock.components
        },
    }
    return hashlib.sha256(json.dumps(part, sort_keys=True).encode()).hexdigest()


def foundation_tag(lock: SourceLock) -> str:
    return f"dcpqual/{lock.image}-foundation:{foundation_key(lock)[:16]}"


def foundation_reference(lock: SourceLock) -> str:
    """What the main Dockerfile builds FROM: the prebuilt image by digest, or the tag the
    from-source foundation is built under."""
    if lock.foundation.kind == "image":
        return lock.foundation.image.pinned
    return foundation_tag(lock)


def foundation_build_args(lock: SourceLock) -> dict[str, str]:
    """Dockerfile.foundation's build arguments (a from-source foundation only)."""
    v = lock.versions
    numbers = arch_numbers(v.torch_cuda_arch_list)
    args = {
        "CUDA_DEVEL_IMAGE": lock.foundation.image.pinned,
        "LOCK_CUDA_VERSION": v.cuda,
        "LOCK_TORCH_VERSION": v.torch,
        "LOCK_NCCL_VERSION": v.nccl,
        "LOCK_TRITON_VERSION": v.triton,
        "TORCH_CUDA_ARCH_LIST": v.torch_cuda_arch_list,
        "NCCL_GENCODE": nccl_gencode(v.torch_cuda_arch_list),
        "NCCL_CUBIN_ARCH": f"sm_{numbers[0]}",
        "NCCL_PTX_ARCH": f"compute_{numbers[-1]}",
        "MAX_JOBS": str(lock.build.max_jobs),
        "NVCC_THREADS": str(lock.build.nvcc_threads),
    }
    for name in FOUNDATION_COMPONENTS:
        for field in COMPONENT_FIELDS:
            args[component_arg(name, field)] = getattr(lock.components[name].source, field)
    return args


def foundation_labels(lock: SourceLock) -> dict[str, str]:
    """The labels a foundation must carry: the lock's own for a prebuilt one, ours for one
    built from source."""
    if lock.foundation.kind == "image":
        return dict(lock.foundation.labels)
    v = lock.versions
    p = f"{LABEL_PREFIX}.foundation"
    labels = {
        f"{p}.base": lock.foundation.image.pinned,
        f"{p}.version.cuda": v.cuda,
        f"{p}.version.torch": v.torch,
        f"{p}.version.nccl": v.nccl,
        f"{p}.version.triton": v.triton,
        f"{p}.torch-cuda-arch-list": v.torch_cuda_arch_list,
    }
    for name in FOUNDATION_COMPONENTS:
        for field in ("ref", "commit", "tree"):
            labels[f"{p}.source.{name}.{field}"] = getattr(lock.components[name].source, field)
    return labels


def cache_fingerprint(sha256: str) -> str:
    """The JIT cache folder's name: a cache compiled against another lock is never reused."""
    return f"lock-{sha256[:16]}"


def _image_components(lock: SourceLock) -> dict[str, Component | None]:
    """Components the main Dockerfile builds: the fork, and b12x (absent when it comes from
    flashinfer-python: its arguments are then empty and its stage builds nothing)."""
    return {"vllm": lock.components.get("vllm"), "b12x": lock.components.get("b12x")}


def build_args(lock: SourceLock, sha256: str, harness: gitinfo.GitIdentity) -> dict[str, str]:
    """The Dockerfile's build arguments, every one computed from the lock or the harness tree."""
    v = lock.versions
    b = lock.b12x_from
    flashinfer = f"flashinfer-python=={b.flashinfer_version}" if b.flashinfer_version else ""
    args = {
        "FOUNDATION_IMAGE": foundation_reference(lock),
        "LOCK_SHA256": sha256,
        "LOCK_CUDA_VERSION": v.cuda,
        "LOCK_TORCH_VERSION": v.torch,
        "LOCK_NCCL_VERSION": v.nccl,
        "LOCK_TRITON_VERSION": v.triton,
        "TORCH_CUDA_ARCH_LIST": v.torch_cuda_arch_list,
        "CMAKE_CUDA_ARCHITECTURES": ";".join(
            n + ("a" if item.strip().endswith("a") else "")
            for n, item in zip(
                arch_numbers(v.torch_cuda_arch_list),
                v.torch_cuda_arch_list.replace("+PTX", "").split(";"),
                strict=True,
            )
        ),
        "MAX_JOBS": str(lock.build.max_jobs),
        "NVCC_THREADS": str(lock.build.nvcc_threads),
        "VLLM_BUILD_REQUIREMENTS": lock.vllm_build.build_requirements,
        "VLLM_RUNTIME_REQUIREMENTS": lock.vllm_build.runtime_requirements,
        "VLLM_REQUIRE_RUST_FRONTEND": "1" if lock.vllm_build.rust_frontend else "0",
        "RUST_TOOLCHAIN": lock.vllm_build.rust_toolchain,
        "PIP_PINS": " ".join(f"{p.name}=={p.version}" for p in lock.python_pins),
        "B12X_FROM": b.kind,
        "FLASHINFER_SPEC": flashinfer,
        "FLASHINFER_INDEX_URL": b.index_url or "",
        "CACHE_FINGERPRINT": cache_fingerprint(sha256),
        "HARNESS_COMMIT": harness.commit,
        "HARNESS_TREE": harness.tree,
        "HARNESS_DIRTY": "true" if harness.dirty else "false",
    }
    for name, comp in _image_components(lock).items():
        for field in COMPONENT_FIELDS:
            args[component_arg(name, field)] = getattr(comp.source, field) if comp else ""
        args[component_arg(name, "pull_requests")] = pull_requests_arg(comp)
    return args


def image_labels(lock: SourceLock, sha256: str, harness: gitinfo.GitIdentity) -> dict[str, str]:
    """The labels the built image must carry: lock sha256, versions, every commit and tree."""
    p = LABEL_PREFIX
    args = build_args(lock, sha256, harness)
    v = lock.versions
    labels = {
        f"{p}.lock.sha256": sha256,
        f"{p}.foundation.image": foundation_reference(lock),
        f"{p}.version.cuda": v.cuda,
        f"{p}.version.torch": v.torch,
        f"{p}.version.nccl": v.nccl,
        f"{p}.version.triton": v.triton,
        f"{p}.torch-cuda-arch-list": v.torch_cuda_arch_list,
        f"{p}.pip-pins": args["PIP_PINS"],
        f"{p}.b12x.from": args["B12X_FROM"],
        f"{p}.b12x.flashinfer": args["FLASHINFER_SPEC"],
        f"{p}.cache.fingerprint": args["CACHE_FINGERPRINT"],
        f"{p}.harness.commit": harness.commit,
        f"{p}.harness.tree": harness.tree,
        f"{p}.harness.dirty": "true" if harness.dirty else "false",
        "org.opencontainers.image.revision": harness.commit,
    }
    for name in _image_components(lock):
        for field in COMPONENT_FIELDS:
            labels[f"{p}.source.{name}.{field}"] = args[component_arg(name, field)]
        labels[f"{p}.source.{name}.pull-requests"] = args[component_arg(name, "pull_requests")]
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
    foundation: FoundationPlan


@dataclass(frozen=True)
class FoundationPlan:
    """The image the main Dockerfile builds FROM: built here from Dockerfile.foundation
    (`dockerfile` set) or a prebuilt one pulled by digest; either way held to `labels`."""

    kind: str  # "source" | "image"
    reference: str  # the tag it is built under, or the pinned prebuilt reference
    labels: dict[str, str]
    dockerfile: Path | None = None  # relative to root; None for a prebuilt foundation
    args: dict[str, str] = dataclasses.field(default_factory=dict)


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
    foundation = plan_foundation(root, rel_lock.parent, lock)
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
        foundation=foundation,
    )


def plan_foundation(root: Path, image_dir: Path, lock: SourceLock) -> FoundationPlan:
    """The foundation's plan; Dockerfile.foundation must agree with the lock like Dockerfile."""
    labels = foundation_labels(lock)
    if lock.foundation.kind == "image":
        return FoundationPlan("image", lock.foundation.image.pinned, labels)
    rel = image_dir / "Dockerfile.foundation"
    if not (root / rel).is_file():
        raise UsageError(f"the lock builds its foundation from source but {rel} is missing")
    args = foundation_build_args(lock)
    problems = dockerfile_problems(dockerfile.read(root / rel), args, labels)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(f"{rel}: {problems[0]}{more}")
    return FoundationPlan("source", foundation_tag(lock), labels, rel, args)


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
            base_image=foundation_reference(plan.lock),
            versions={
                k: v
                for k, v in plan.lock.versions.model_dump().items()
                if k != "torch_cuda_arch_list"
            },
            torch_cuda_arch_list=plan.lock.versions.torch_cuda_arch_list,
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


def buildx_argv(
    dockerfile_path: Path, tag: str, args: Mapping[str, str], metadata_file: Path
) -> list[str]:
    """`docker buildx build` with SLSA provenance (max) and an SBOM attested, the context a tar
    on stdin (the same reproducible tar of tracked files the SDK path sends). It runs on the
    current builder: the engine's own (`docker` driver) must use the containerd image store to
    keep attestations on a loaded image, and is the one that sees a foundation built here."""
    argv = ["docker", "buildx", "build", "--file", str(dockerfile_path), "--tag", tag]
    for key, value in sorted(args.items()):
        argv += ["--build-arg", f"{key}={value}"]
    argv += [
        "--provenance=mode=max",
        "--sbom=true",
        "--load",
        "--metadata-file",
        str(metadata_file),
        "-",
    ]
    return argv


def has_buildx(run: Callable[..., Any] = subprocess.run) -> bool:
    """Whether the docker CLI here has BuildKit's buildx (attestations need it; the SDK's
    classic /build endpoint cannot make them)."""
    try:
        done = run(["docker", "buildx", "version"], capture_output=True, text=True, check=False)
    except OSError:
        return False
    return bool(done.returncode == 0)


def _build_one(
    client: Any,
    context: bytes,
    dockerfile_path: Path,
    tag: str,
    args: Mapping[str, str],
    emit: Emit,
    buildx: bool,
) -> str:
    """Build one Dockerfile; the image id. BuildKit (with attestations) where the CLI has it."""
    if buildx:
        with tempfile.TemporaryDirectory() as tmp:
            meta = Path(tmp) / "metadata.json"
            argv = buildx_argv(dockerfile_path, tag, args, meta)
            emit("$ " + " ".join(argv[:6]) + " ... --provenance=mode=max --sbom=true")
            done = subprocess.run(argv, input=context, check=False)
            if done.returncode != 0:
                raise ImageBuildError(f"docker buildx build exited {done.returncode}")
            try:
                data = json.loads(meta.read_text())
                return str(data["containerimage.config.digest"])
            except (OSError, ValueError, KeyError):
                raise ImageBuildError("docker buildx wrote no image digest") from None
    events = client.api.build(
        fileobj=io.BytesIO(context),
        custom_context=True,
        dockerfile=str(dockerfile_path),
        tag=tag,
        buildargs=dict(args),
        rm=True,
        forcerm=True,
        pull=False,  # the base is pinned by digest; the engine fetches exactly that
        decode=True,
        timeout=None,  # a from-source torch build takes hours
    )
    return consume_build_events(events, emit)


def ensure_foundation(
    plan: BuildPlan, client: Any, context: bytes, emit: Emit, buildx: bool
) -> None:
    """The foundation on the engine, carrying its labels: reused when an image of that tag
    already does, built (from source) or pulled by digest (prebuilt) otherwise."""
    f = plan.foundation
    try:
        found = client.api.inspect_image(f.reference)
    except Exception:  # docker.errors.ImageNotFound and friends
        found = None
    if found is None:
        if f.dockerfile is None:
            emit(f"pulling the foundation {f.reference}")
            client.api.pull(f.reference)
        else:
            emit(f"building the foundation {f.reference} from {f.dockerfile} (hours)")
            _build_one(client, context, f.dockerfile, f.reference, f.args, emit, buildx)
        found = client.api.inspect_image(f.reference)
    labels = (found.get("Config") or {}).get("Labels") or {}
    if wrong := label_mismatches(f.labels, labels):
        raise ImageBuildError(f"foundation {f.reference} is not the lock's: {wrong[0]}")


def run_build(
    plan: BuildPlan, client: Any, emit: Emit, buildx: bool | None = None
) -> ImageIdentity:
    """Build `plan` on the engine behind `client` (its foundation first); check labels and run
    the in-image check. `buildx` None: use BuildKit where the docker CLI has it."""
    if buildx is None:
        buildx = has_buildx()
    context = context_tar(plan.root, plan.context_files)
    emit(
        f"building {plan.tag} from {plan.lock_path} (sha256 {plan.lock_sha256}), "
        f"context {len(plan.context_files)} files, {len(context) // 1024} KiB, "
        f"{'BuildKit with provenance and SBOM' if buildx else 'classic builder, no attestations'}"
    )
    ensure_foundation(plan, client, context, emit, buildx)
    image_id = _build_one(client, context, plan.dockerfile, plan.tag, plan.args, emit, buildx)
    inspect = client.api.inspect_image(image_id)
    found = (inspect.get("Config") or {}).get("Labels") or {}
    if wrong := label_mismatches(plan.labels, found):
        raise ImageBuildError(f"built image {inspect['Id']} does not carry the lock: {wrong[0]}")
    emit(f"built {inspect['Id']}; running the in-image identity check")
    runtime = check_in_image(client, str(inspect["Id"]))
    return identity_from(plan, inspect, runtime, _utc_now())
