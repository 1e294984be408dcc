"""The in-image identity check: does this Python environment hold what the lock says?

`python -m harness.image.verify_runtime [--lock FILE] [--image-root DIR] [--json]`

Compares, against the source lock: torch's version and the commit it was built from
(`torch.version.git_version`), the CUDA it was built for, the NCCL it loads, the CUDA arch it was
compiled for, each component's commit and tree as git reported them when the image fetched it
(`<image root>/sources/<name>.json`, written by fetch-source.sh), the lock sha256 the image was
built with (`<image root>/build.json`), and that the vLLM fork and b12x are installed. Exit 0 only
when everything matches; 1 with every mismatch listed; 2 for unusable arguments. Outside an image
(a CPU torch, no CUDA) it lists those mismatches: it never passes by default.

The report (`RuntimeReport.to_json()`): `schema` ("dcpqual-image-runtime/v1"), `ok`,
`lock_path`, `lock_sha256`, `image_lock_sha256`, `expected` {torch, torch_commit, cuda, nccl,
arch, sources}, `observed` {torch, torch_commit, cuda, nccl, arch, cuda_available, devices,
packages, sources, harness}, `mismatches` [one line each].
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import DcpqualError, UsageError
from harness.image.lock import (
    REQUIRED_CUDA,
    REQUIRED_TORCH,
    check_lock,
    load_lock,
)
from harness.jsonfile import read_json
from harness.schema.lock import SourceLock

RUNTIME_SCHEMA = "dcpqual-image-runtime/v1"
DEFAULT_IMAGE_ROOT = Path("/opt/dcpqual/image")
DEFAULT_LOCK = Path("images/kimi-k3-cu133-torch213/source.lock.json")
# Components that are Python distributions in the image: name in the lock -> distribution.
PACKAGES = {"vllm": "vllm", "b12x": "b12x"}


def default_lock_path() -> Path:
    return Path(os.environ.get("DCPQUAL_LOCK") or DEFAULT_LOCK)


def default_image_root() -> Path:
    return Path(os.environ.get("DCPQUAL_IMAGE_ROOT") or DEFAULT_IMAGE_ROOT)


@dataclass(frozen=True)
class Observed:
    """What this environment holds; None where it holds nothing to compare."""

    torch: str | None
    torch_commit: str | None
    cuda: str | None
    nccl: str | None
    arch: tuple[str, ...]
    cuda_available: bool
    devices: tuple[str, ...]
    packages: dict[str, str | None]
    sources: dict[str, dict[str, str]]
    image_lock_sha256: str | None
    harness: dict[str, Any] | None
    notes: tuple[str, ...] = ()  # why something could not be observed

    def to_json(self) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "torch_commit": self.torch_commit,
            "cuda": self.cuda,
            "nccl": self.nccl,
            "arch": list(self.arch),
            "cuda_available": self.cuda_available,
            "devices": list(self.devices),
            "packages": dict(self.packages),
            "sources": {k: dict(v) for k, v in self.sources.items()},
            "harness": self.harness,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class RuntimeReport:
    ok: bool
    lock_path: str
    lock_sha256: str | None
    image_lock_sha256: str | None
    expected: dict[str, Any]
    observed: Observed
    mismatches: tuple[str, ...]
    schema: str = field(default=RUNTIME_SCHEMA)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "ok": self.ok,
            "lock_path": self.lock_path,
            "lock_sha256": self.lock_sha256,
            "image_lock_sha256": self.image_lock_sha256,
            "expected": self.expected,
            "observed": self.observed.to_json(),
            "mismatches": list(self.mismatches),
        }


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = read_json(path)
    except (OSError, ValueError):  # missing, hostile or not strict JSON: nothing to trust
        return None
    return data if isinstance(data, dict) else None


def observe(image_root: Path) -> Observed:
    """Read torch and the image's provenance files; never raises, records what it lacked."""
    notes: list[str] = []
    import torch

    nccl: str | None = None
    try:
        # (major, minor, patch) or (major, minor, patch, suffix); the lock pins the first three.
        nccl = ".".join(str(n) for n in torch.cuda.nccl.version()[:3])
    except (AttributeError, RuntimeError) as exc:  # CPU builds have no _nccl_version
        notes.append(f"nccl: {type(exc).__name__}: {exc}")
    flags_fn = getattr(torch._C, "_cuda_getArchFlags", None)
    flags = flags_fn() if flags_fn is not None else None
    available = bool(torch.cuda.is_available())
    devices: tuple[str, ...] = ()
    if available:
        devices = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    packages: dict[str, str | None] = {}
    for name, dist in PACKAGES.items():
        try:
            packages[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    sources: dict[str, dict[str, str]] = {}
    source_dir = image_root / "sources"
    if source_dir.is_dir():
        for path in sorted(source_dir.glob("*.json")):
            data = _read_json(path)
            if data is not None:
                sources[path.stem] = {k: str(v) for k, v in data.items()}
    else:
        notes.append(f"no provenance folder {source_dir} (not inside a dcpqual image?)")
    build = _read_json(image_root / "build.json") or {}
    return Observed(
        torch=torch.__version__,
        torch_commit=getattr(torch.version, "git_version", None),
        cuda=torch.version.cuda,
        nccl=nccl,
        arch=tuple(flags.split()) if flags else (),
        cuda_available=available,
        devices=devices,
        packages=packages,
        sources=sources,
        image_lock_sha256=build.get("lock_sha256"),
        harness=build.get("harness"),
        notes=tuple(notes),
    )


def expected_from(lock: SourceLock | None) -> dict[str, Any]:
    """What a correct image holds, from the lock (the image's fixed versions without one)."""
    if lock is None:
        return {"torch": REQUIRED_TORCH, "cuda": REQUIRED_CUDA, "sources": {}}
    pytorch = lock.components.get("pytorch")
    return {
        "torch": lock.versions.torch,
        "torch_commit": pytorch.source.commit if pytorch else None,
        "cuda": lock.versions.cuda,
        "nccl": lock.versions.nccl,
        "arch": "sm_" + lock.torch_cuda_arch_list.replace(".", ""),
        "sources": {
            name: {"commit": c.source.commit, "tree": c.source.tree}
            for name, c in lock.components.items()
        },
    }


def compare(expected: dict[str, Any], observed: Observed, lock_sha256: str | None) -> list[str]:
    """Every difference between `expected` and `observed`, one line each (pure)."""
    out: list[str] = []

    def differ(what: str, want: Any, got: Any) -> None:
        if want is not None and want != got:
            out.append(f"{what}: expected {want}, found {got if got is not None else 'none'}")

    differ("torch", expected.get("torch"), observed.torch)
    differ("torch commit", expected.get("torch_commit"), observed.torch_commit)
    differ("cuda", expected.get("cuda"), observed.cuda)
    differ("nccl", expected.get("nccl"), observed.nccl)
    arch = expected.get("arch")
    if arch is not None and observed.arch != (arch,):
        found = " ".join(observed.arch) or "none (no CUDA build)"
        out.append(f"cuda arch: expected only {arch}, found {found}")
    for name, want in sorted(expected.get("sources", {}).items()):
        got = observed.sources.get(name)
        if got is None:
            out.append(f"source {name}: no provenance in the image")
            continue
        for key in ("commit", "tree"):
            if got.get(key) != want[key]:
                out.append(f"source {name}: {key} expected {want[key]}, found {got.get(key)}")
    for name, version in sorted(observed.packages.items()):
        if name in expected.get("sources", {}) and version is None:
            out.append(f"package {name}: not installed")
    if lock_sha256 is not None and observed.image_lock_sha256 != lock_sha256:
        found = observed.image_lock_sha256 or "none (no build.json)"
        out.append(f"lock sha256: expected {lock_sha256}, the image was built with {found}")
    return out


def verify(lock_path: Path, image_root: Path | None = None) -> RuntimeReport:
    """Check this environment against the lock at `lock_path`."""
    lock_path = Path(lock_path)
    if not lock_path.is_file():
        raise UsageError(f"no lock at {lock_path}; pass --lock FILE")
    image_root = default_image_root() if image_root is None else Path(image_root)
    mismatches = [f"lock: {p}" for p in check_lock(lock_path)]
    try:
        lock: SourceLock | None = load_lock(lock_path)
    except UsageError:
        lock = None
    lock_sha = hashlib.sha256(lock_path.read_bytes()).hexdigest()
    expected = expected_from(lock)
    observed = observe(image_root)
    # An unpinned lock value never matches anything, so a template lock can never pass.
    mismatches += compare(expected, observed, lock_sha)
    return RuntimeReport(
        ok=not mismatches,
        lock_path=str(lock_path),
        lock_sha256=lock_sha,
        image_lock_sha256=observed.image_lock_sha256,
        expected=expected,
        observed=observed,
        mismatches=tuple(mismatches),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.image.verify_runtime",
        description="Check torch, CUDA, NCCL and the component sources in this image against "
        "the source lock.",
    )
    parser.add_argument("--lock", type=Path, default=None, help=f"default: {DEFAULT_LOCK}")
    parser.add_argument(
        "--image-root", type=Path, default=None, help=f"default: {DEFAULT_IMAGE_ROOT}"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    args = parser.parse_args(argv)
    try:
        report = verify(args.lock or default_lock_path(), args.image_root)
    except DcpqualError as exc:
        print(f"verify_runtime: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    for line in report.mismatches:
        print(f"verify_runtime: mismatch: {line}", file=sys.stderr)
    verdict = "ok" if report.ok else f"{len(report.mismatches)} mismatch(es)"
    print(
        f"verify_runtime: {verdict} (lock {report.lock_path}, sha256 {report.lock_sha256})",
        file=sys.stderr,
    )
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
