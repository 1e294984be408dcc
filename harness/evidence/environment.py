"""Where a run happened (torch, CUDA, NCCL, GPUs, host, filtered environment), and its secrets.

Environment variables are kept only under the prefixes that change what NCCL, vLLM, b12x, torch
and CUDA do. Any variable whose name looks like a secret is redacted where it is kept, and the
*values* of every secret-looking variable in the launcher's environment are handed to the writer
so it can scrub them out of every file in the bundle (ranks inherit that environment, so a value
a test printed into a log or a JUnit report is one of these).
"""

from __future__ import annotations

import json
import os
import platform
import socket
from collections.abc import Iterable, Mapping
from typing import Any
from xml.sax.saxutils import escape, quoteattr

import torch

from harness.evidence.schema import Environment, Gpu

KEPT_PREFIXES: tuple[str, ...] = ("NCCL_", "VLLM_", "B12X_", "TORCH_", "CUDA_")
SECRET_MARKERS: tuple[str, ...] = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")
REDACTED = "<redacted>"
# What replaces a secret value found in a file: safe inside JSON strings, XML and Markdown.
SCRUBBED = b"[REDACTED]"
# Values shorter than this are not scrubbed from files: replacing "1" or "true" everywhere
# would corrupt the bundle and hide nothing (they are still redacted in `env`).
MIN_SCRUB_LENGTH = 8


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def filtered_env(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(kept variables with secrets redacted, names of the redacted ones)."""
    kept: dict[str, str] = {}
    redacted: list[str] = []
    for name in sorted(environ):
        if not name.startswith(KEPT_PREFIXES):
            continue
        if is_secret_name(name):
            kept[name] = REDACTED
            redacted.append(name)
        else:
            kept[name] = environ[name]
    return kept, redacted


def secret_values(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Values of every secret-looking variable, long enough to scrub safely, longest first."""
    values = {
        value
        for name, value in environ.items()
        if is_secret_name(name) and len(value.strip()) >= MIN_SCRUB_LENGTH
    }
    return tuple(sorted(values, key=lambda v: (-len(v), v)))


def secret_forms(secrets: Iterable[str]) -> tuple[bytes, ...]:
    """The byte forms a secret can take in our files: raw, JSON-escaped, XML-escaped."""
    forms: set[bytes] = set()
    for value in secrets:
        for text in (
            value,
            json.dumps(value)[1:-1],
            json.dumps(value, ensure_ascii=False)[1:-1],
            escape(value),
            quoteattr(value)[1:-1],
            escape(value, {'"': "&quot;", "'": "&apos;"}),
            value.replace("&", "&amp;").replace("<", "&lt;"),  # writers that leave '>' alone
        ):
            if text:
                forms.add(text.encode("utf-8"))
    return tuple(sorted(forms, key=lambda f: (-len(f), f)))


def scrub(data: bytes, forms: Iterable[bytes]) -> tuple[bytes, int]:
    """`data` with every secret form replaced by SCRUBBED, and how many were replaced."""
    count = 0
    for form in forms:
        hits = data.count(form)
        if hits:
            data = data.replace(form, SCRUBBED)
            count += hits
    return data, count


def _nccl_version() -> str | None:
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
        import pynvml  # type: ignore[import-not-found]
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


def capture_environment(
    environ: Mapping[str, str] | None = None, hosts: Iterable[str] = ()
) -> Environment:
    """Describe this process's machine. `hosts` are the hostnames the ranks reported."""
    environ = os.environ if environ is None else environ
    env, redacted = filtered_env(environ)
    nvml = _nvml_gpus()
    if nvml is not None:
        gpus, driver = nvml
    else:
        gpus, driver = _torch_gpus(), None
    return Environment(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        nccl=_nccl_version(),
        device_names=[g.name for g in gpus] or ["cpu"],
        python=platform.python_version(),
        host=socket.gethostname(),
        hosts=sorted({h for h in hosts if h}),
        platform=platform.platform(),
        cpu_count=os.cpu_count(),
        torch_git=getattr(torch.version, "git_version", None),
        cuda_available=torch.cuda.is_available(),
        driver=driver,
        gpus=gpus,
        nvml=nvml is not None,
        env=env,
        redacted=redacted,
    )
