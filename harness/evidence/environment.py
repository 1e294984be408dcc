"""Where a run happened (torch, CUDA, NCCL, GPUs, host, filtered environment), and its secrets.

Environment variables are kept only under the prefixes that change what NCCL, vLLM, b12x, torch
and CUDA do. Any variable whose name looks like a secret (`harness.core.secrets` says which)
is redacted where it is kept, and so is the password of a URL in a kept value (whatever its
length); the writer scrubs the *values* of every such variable, and URL passwords long enough to
scrub, out of the bundle, and (whatever the environment holds) the userinfo of URLs and the values
that text assigns to secret names.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import socket
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.secrets import (
    MIN_SCRUB_LENGTH,
    REDACTED,
    SCRUBBED,
    Scrubber,
    is_secret_name,
    secret_patterns,
    secret_values,
    without_url_passwords,
)
from harness.schema.receipt import Environment, Gpu

__all__ = [
    "KEPT_PREFIXES",
    "MIN_SCRUB_LENGTH",
    "REDACTED",
    "SCRUBBED",
    "capture_environment",
    "filtered_env",
    "is_secret_name",
    "scrub",
    "secret_forms",
    "secret_values",
]

KEPT_PREFIXES: tuple[str, ...] = ("NCCL_", "VLLM_", "B12X_", "TORCH_", "CUDA_")


def filtered_env(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(kept variables with secrets redacted, names of the redacted ones)."""
    patterns = secret_patterns(environ)
    kept: dict[str, str] = {}
    redacted: list[str] = []
    for name in sorted(environ):
        if not name.startswith(KEPT_PREFIXES):
            continue
        if is_secret_name(name, patterns):
            kept[name] = REDACTED
            redacted.append(name)
        else:
            kept[name] = without_url_passwords(environ[name])
    return kept, redacted


def secret_forms(secrets: Iterable[str]) -> tuple[bytes, ...]:
    """The byte forms a secret can take in our files (every print form, see `redact`)."""
    return tuple(f.encode("utf-8") for f in Scrubber.of(secrets).forms)


def scrub(data: bytes, forms: Iterable[bytes]) -> tuple[bytes, int]:
    """`data` with every secret form replaced by SCRUBBED, and how many were replaced."""
    return Scrubber(tuple(f.decode("utf-8") for f in forms)).data(data)


def _nccl_version() -> str | None:
    import torch

    try:
        version: Any = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):  # CPU builds have no NCCL bindings
        return None
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version)


def _nvml_gpus() -> tuple[list[Gpu], str | None] | None:
    """GPUs and driver from nvidia-ml-py, or None where it is missing or finds no driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                Gpu(
                    index=index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    memory_total_mib=int(memory.total) // (1 << 20),
                )
            )
        return gpus, driver
    except Exception:  # a GPU that NVML cannot read must not cost us the bundle
        return None
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _torch_gpus() -> list[Gpu]:
    import torch

    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        gpus.append(
            Gpu(
                index=index,
                name=props.name,
                uuid=None if uuid is None else f"GPU-{uuid}",
                memory_total_mib=int(props.total_memory) // (1 << 20),
            )
        )
    return gpus


@dataclass(frozen=True)
class _TorchBuild:
    """What torch says about its own build: `torch.__version__` and `torch.version`."""

    version: str
    cuda: str | None
    hip: str | None
    git: str | None


def _cpu_build() -> _TorchBuild | None:
    """The build of a torch that is not imported yet, read from its `torch/version.py` alone,
    when that build has neither CUDA nor ROCm: then there is no GPU, NCCL or device runtime to
    ask torch about, and importing it (seconds, after the ranks have finished) would add
    nothing. None for any other build, or when torch is imported already (asking it is free)."""
    if "torch" in sys.modules:
        return None
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    source = importlib.util.spec_from_file_location("_dcpqual_torch_build", path)
    if source is None or source.loader is None:
        return None
    module = importlib.util.module_from_spec(source)
    try:
        source.loader.exec_module(module)
    except (OSError, SyntaxError, ImportError):
        return None
    version, cuda, hip = (getattr(module, n, None) for n in ("__version__", "cuda", "hip"))
    if not isinstance(version, str) or cuda is not None or hip is not None:
        return None
    git = getattr(module, "git_version", None)
    return _TorchBuild(version, None, None, git if isinstance(git, str) else None)


# The CPU features vLLM's CPU platform chooses by (`torch.cpu._is_amx_tile_supported`, its
# AVX-512 kernels), as /proc/cpuinfo names them.
CPU_FEATURES: tuple[str, ...] = (
    "amx_bf16",
    "amx_int8",
    "amx_tile",
    "avx512_bf16",
    "avx512f",
    "avx2",
)


def cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """Which of CPU_FEATURES the first CPU of `cpuinfo` has; none where it cannot be read."""
    try:
        with cpuinfo.open(encoding="utf-8", errors="replace") as lines:
            flags = next((line for line in lines if line.startswith("flags")), "")
    except OSError:
        return []
    have = set(flags.partition(":")[2].split())
    return [feature for feature in CPU_FEATURES if feature in have]


def host_digest(name: str) -> str:
    """What a receipt says of a host: `host-` and the first 16 hex of the name's sha256. Two
    ranks on one host share it and verify can re-derive it from the rank records, but no file
    meant for a pull request (summary.md, compare.md) carries a machine's name: the community
    publishes receipts without host names, addresses or uname data."""
    import hashlib

    return "host-" + hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]


def capture_environment(
    environ: Mapping[str, str] | None = None, hosts: Iterable[str] = ()
) -> Environment:
    """Describe this process's machine without naming it (`host_digest`; the platform is the
    OS and architecture, not uname's node and kernel). `hosts` are the ranks' host digests."""
    environ = os.environ if environ is None else environ
    env, redacted = filtered_env(environ)
    build = _cpu_build()
    if build is None:
        import torch  # here, not at import: `verify` reads bundles without torch

        build = _TorchBuild(
            str(torch.__version__),
            torch.version.cuda,
            getattr(torch.version, "hip", None),
            getattr(torch.version, "git_version", None),
        )
        cuda_available, nccl = torch.cuda.is_available(), _nccl_version()
    else:
        cuda_available, nccl = False, None
    nvml = _nvml_gpus()
    if nvml is not None:
        gpus, driver = nvml
    else:
        gpus, driver = (_torch_gpus() if cuda_available else []), None
    return Environment(
        torch=build.version,
        cuda=build.cuda,
        nccl=nccl,
        device_names=[g.name for g in gpus] or ["cpu"],
        python=platform.python_version(),
        host=host_digest(socket.gethostname()),
        hosts=sorted({h for h in hosts if h}),
        platform=f"{platform.system()}-{platform.machine()}",
        cpu_count=os.cpu_count(),
        cpu_features=cpu_features(),
        torch_git=build.git,
        cuda_available=cuda_available,
        driver=driver,
        gpus=gpus,
        nvml=nvml is not None,
        env=env,
        redacted=redacted,
    )
