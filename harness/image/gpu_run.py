"""Run the suites on 16 GPUs: in the source-locked image (`docker run`), or on the host.

The container spec is a value (`ContainerSpec`) built by a pure function, so tests can hold it to
the rules: all GPUs, `--ipc=host` (CUDA IPC between ranks), memlock unlimited (pinned buffers),
never `--privileged`, the evidence folder mounted, the host NCCL environment (PCIe only:
NCCL_P2P_LEVEL=SYS, NCCL_IB_DISABLE=1), and the image started by digest, not by tag. The same
spec renders as SDK keyword arguments (what runs) and as a `docker run` line (what is logged, so
a person can reproduce it). Preflight fails closed, with one line, before anything is written:
no identity, a lock that moved since the build, fewer GPUs than ranks, no engine, image missing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.image.identity import IDENTITY_ENV, ImageIdentity, read_identity
from harness.image.lock import lock_sha256

GPU_RANKS = 16
NCCL_HOST_ENV: dict[str, str] = {"NCCL_P2P_LEVEL": "SYS", "NCCL_IB_DISABLE": "1"}
CONTAINER_EVIDENCE = "/evidence"
CONTAINER_WORKDIR = "/opt/dcpqual/src"  # where the Dockerfile put the harness (suites/ included)
CONTAINER_HOME = "/tmp/dcpqual-home"  # writable for any uid: Triton and CuTe DSL caches
STACK_BYTES = 64 * 1024 * 1024

Emit = Callable[[str], None]


class GpuUnavailable(UsageError):
    """Not enough NVIDIA GPUs visible for the requested ranks."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_mib: int
    driver: str


def parse_nvidia_smi(text: str) -> tuple[GpuInfo, ...]:
    """Rows of `nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,
    noheader,nounits`."""
    gpus = []
    for row in text.splitlines():
        if not row.strip():
            continue
        cells = [c.strip() for c in row.split(",")]
        if len(cells) != 4:
            raise GpuUnavailable(f"cannot read nvidia-smi output row {row.strip()!r}")
        index, name, memory, driver = cells
        gpus.append(GpuInfo(int(index), name, int(float(memory)), driver))
    return tuple(gpus)


def query_gpus(run: Callable[..., Any] = subprocess.run) -> tuple[GpuInfo, ...]:
    """The host's NVIDIA GPUs, via nvidia-smi; none visible is an error naming why."""
    cmd = [
        "nvidia-smi",
        "--query-gpu=index,name,memory.total,driver_version",
        "--format=csv,noheader,nounits",
    ]
    try:
        done = run(cmd, capture_output=True, text=True, check=False, timeout=60)
    except FileNotFoundError:
        raise GpuUnavailable("no NVIDIA driver here: nvidia-smi not found") from None
    except subprocess.TimeoutExpired:
        raise GpuUnavailable("nvidia-smi did not answer within 60 s") from None
    if done.returncode != 0:
        reason = " ".join((done.stderr or done.stdout or "failed").split())
        raise GpuUnavailable(f"nvidia-smi failed: {reason}")
    return parse_nvidia_smi(done.stdout)


def require_gpus(needed: int, gpus: Sequence[GpuInfo]) -> None:
    """Fail closed unless at least `needed` GPUs are visible."""
    if len(gpus) < needed:
        names = sorted({g.name for g in gpus})
        seen = f" ({', '.join(names)})" if names else ""
        raise GpuUnavailable(
            f"found {len(gpus)} NVIDIA GPU(s){seen}; this run needs {needed} "
            f"(16 x RTX PRO 6000 in one host)"
        )


# The GPU node qualifies the installed vLLM's own startup too: the engine lane runs beside the
# stand-in lane in the same bundle, with the production Kimi-K3 launch as the lane's GPU
# defaults (`harness.engine.settings`: B12X_MLA, VLLM_USE_B12X_DCP_A2A=1, DCP = TP = the ranks,
# CUDA graphs at the decode capture sizes).
GPU_MODELS = "stand-in,engine"


def run_argv(
    nproc: int,
    out: str,
    pytest_args: Sequence[str] = (),
    backend: str = "nccl",
    models: str = GPU_MODELS,
) -> tuple[str, ...]:
    """The `dcpqual run` command line the GPU runs use, in the container or on the host."""
    argv: tuple[str, ...] = ("dcpqual", "run", "--nproc-per-node", str(nproc))
    argv = (*argv, "--backend", backend, "--models", models, "--out", out)
    return (*argv, "--", *pytest_args) if pytest_args else argv


@dataclass(frozen=True)
class Mount:
    source: str  # host path
    target: str  # container path
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """One `docker run`: what runs, with which devices, limits, mounts and environment."""

    image: str  # a digest or image id, never a movable tag
    command: tuple[str, ...]
    environment: Mapping[str, str]
    mounts: tuple[Mount, ...]
    workdir: str
    user: str | None = None
    gpus: str = "all"
    ipc_mode: str = "host"
    memlock: int = -1  # unlimited
    stack_bytes: int = STACK_BYTES
    privileged: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_sdk_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `docker.DockerClient.containers.run`."""
        from docker.types import DeviceRequest, Ulimit

        requests = []
        if self.gpus == "all":
            requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        return {
            "image": self.image,
            "command": list(self.command),
            "environment": dict(self.environment),
            "volumes": {
                m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"}
                for m in self.mounts
            },
            "working_dir": self.workdir,
            "user": self.user,
            "device_requests": requests,
            "ipc_mode": self.ipc_mode,
            "ulimits": [
                Ulimit(name="memlock", soft=self.memlock, hard=self.memlock),
                Ulimit(name="stack", soft=self.stack_bytes, hard=self.stack_bytes),
            ],
            "privileged": self.privileged,
            "labels": dict(self.labels),
            "detach": True,
        }

    def to_cli_argv(self, redact: Sequence[str] = (IDENTITY_ENV,)) -> list[str]:
        """The equivalent `docker run` line (long env values named in `redact` elided)."""
        argv = ["docker", "run", "--rm"]
        if self.gpus:
            argv += ["--gpus", self.gpus]
        argv += [f"--ipc={self.ipc_mode}", "--ulimit", f"memlock={self.memlock}:{self.memlock}"]
        argv += ["--ulimit", f"stack={self.stack_bytes}:{self.stack_bytes}"]
        if self.privileged:
            argv.append("--privileged")
        if self.user:
            argv += ["--user", self.user]
        for m in self.mounts:
            argv += ["-v", f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}"]
        for key, value in sorted(self.environment.items()):
            argv += ["-e", f"{key}={'...' if key in redact else value}"]
        for key, value in sorted(self.labels.items()):
            argv += ["--label", f"{key}={value}"]
        argv += ["-w", self.workdir, self.image, *self.command]
        return argv


def evidence_name(now: dt.datetime, identity: ImageIdentity | None) -> str:
    """Folder name for one run: UTC time, variant, and the image digest's first 12 hex."""
    stamp = now.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    if identity is None:
        return f"{stamp}-gpu16-host"
    return f"{stamp}-gpu16-{identity.digest.removeprefix('sha256:')[:12]}"


def gpu16_container_spec(
    identity: ImageIdentity,
    evidence_root: Path,
    out_name: str,
    pytest_args: Sequence[str] = (),
    user: str | None = None,
    nproc: int = GPU_RANKS,
) -> ContainerSpec:
    """The container that runs the suites on `nproc` GPUs in the image `identity` names, after
    the image's GPU source gates (whose failure fails the run, `harness.image.gates.gated`)."""
    from harness.image.gates import gated

    env = {
        **NCCL_HOST_ENV,
        "HOME": CONTAINER_HOME,
        IDENTITY_ENV: json.dumps(identity.to_json(), sort_keys=True, separators=(",", ":")),
    }
    return ContainerSpec(
        image=identity.image_id,
        command=gated(run_argv(nproc, f"{CONTAINER_EVIDENCE}/{out_name}", pytest_args)),
        environment=env,
        mounts=(Mount(str(Path(evidence_root).resolve()), CONTAINER_EVIDENCE),),
        workdir=CONTAINER_WORKDIR,
        user=user,
        labels={"io.dcpqual.run": out_name},
    )


def check_identity_current(identity: ImageIdentity, lock_path: Path) -> None:
    """Refuse an image built from another lock, or one that failed its in-image check."""
    if not Path(lock_path).is_file():
        raise UsageError(f"no lock at {lock_path}")
    current = lock_sha256(lock_path)
    if current != identity.source_lock_sha256:
        raise UsageError(
            f"image {identity.digest} was built from lock sha256 {identity.source_lock_sha256}, "
            f"{lock_path} is now {current}; rebuild with nox -s image"
        )
    failure = identity.check_failure()
    if failure is not None:
        raise UsageError(f"image {identity.digest} failed its in-image identity check: {failure}")


def run_container(client: Any, spec: ContainerSpec, emit: Emit) -> int:
    """Start `spec`, stream its output, return its exit status; the container is removed."""
    container = client.containers.run(**spec.to_sdk_kwargs())
    try:
        for chunk in container.logs(stream=True, follow=True):
            for line in chunk.decode("utf-8", errors="replace").splitlines():
                emit(line)
        return int(container.wait().get("StatusCode", 1))
    except KeyboardInterrupt:
        container.stop(timeout=30)
        raise
    finally:
        container.remove(force=True)


def gpu16_in_image(
    identity_path: Path,
    lock_path: Path,
    evidence_root: Path,
    pytest_args: Sequence[str],
    emit: Emit,
    gpus: Callable[[], Sequence[GpuInfo]] = query_gpus,
) -> int:
    """Preflight (identity, lock, GPUs, engine, image), then the suites in the container."""
    from harness.image.engine import connect

    identity = read_identity(identity_path)
    check_identity_current(identity, lock_path)
    require_gpus(GPU_RANKS, gpus())
    client = connect("dcpqual gpu16")
    try:
        found = client.api.inspect_image(identity.image_id)
    except Exception as exc:  # docker.errors.ImageNotFound and friends
        raise UsageError(
            f"image {identity.image_id} ({identity.reference}) is not on this engine: "
            f"{' '.join(str(exc).split())}; rebuild with nox -s image"
        ) from None
    labelled = ((found.get("Config") or {}).get("Labels") or {}).get("io.dcpqual.lock.sha256")
    if labelled != identity.source_lock_sha256:
        raise UsageError(
            f"image {identity.image_id} is labelled lock {labelled}, not "
            f"{identity.source_lock_sha256}; rebuild with nox -s image"
        )
    name = evidence_name(dt.datetime.now(dt.UTC), identity)
    evidence_root.mkdir(parents=True, exist_ok=True)
    spec = gpu16_container_spec(
        identity, evidence_root, name, pytest_args, user=f"{os.getuid()}:{os.getgid()}"
    )
    emit("$ " + " ".join(spec.to_cli_argv()))
    code = run_container(client, spec, emit)
    emit(f"gpu16: exit {code}; evidence in {evidence_root / name}")
    return code


def gpu16_on_host(
    evidence_root: Path,
    pytest_args: Sequence[str],
    emit: Emit,
    gpus: Callable[[], Sequence[GpuInfo]] = query_gpus,
) -> int:
    """The --no-image variant: the same run with this host's Python (never `qualified`)."""
    require_gpus(GPU_RANKS, gpus())
    name = evidence_name(dt.datetime.now(dt.UTC), None)
    argv = run_argv(GPU_RANKS, str(evidence_root / name), pytest_args)
    cmd = [sys.executable, "-m", "harness", *argv[1:]]
    env = {**os.environ, **NCCL_HOST_ENV}
    env.pop(IDENTITY_ENV, None)  # a host run has no image to claim
    emit("$ " + " ".join(f"{k}={v}" for k, v in NCCL_HOST_ENV.items()) + " " + " ".join(argv))
    code = subprocess.run(cmd, env=env, check=False).returncode
    emit(f"gpu16 (host): exit {code}; evidence in {evidence_root / name}")
    return code
