"""The in-image identity check: does this Python environment hold what the lock says?

`python -m harness.image.verify_runtime [--lock FILE] [--image-root DIR] [--json]`

Compares, against the source lock: torch's version and the commit it was built from
(`torch.version.git_version`), the CUDA it was built for, the NCCL it loads, the CUDA arch it was
compiled for, each component's commit and tree as git reported them when the image fetched it
(`<image root>/sources/<name>.json`, written by fetch-source.sh), the lock sha256 the image was
built with (`<image root>/build.json`), and that the vLLM fork and b12x are installed. Exit 0 only
when everything matches; 1 with every mismatch listed; 2 for unusable arguments. Outside an image
(a CPU torch, no CUDA) it lists those mismatches: it never passes by default.

The report is the receipt's own `ImageRuntime` (`harness.schema.image`; schema
"dcpqual-image-runtime/v1"): `ok`, `lock_path`, `lock_sha256`, `image_lock_sha256`, `expected`
{torch, torch_commit, cuda, nccl, arch, sources}, `observed` {torch, torch_commit, cuda, nccl,
arch, cuda_available, devices, packages, sources, image_lock_sha256, harness, notes},
`mismatches` [one line each].
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from harness.errors import DcpqualError, UsageError
from harness.image.lock import check_lock, load_lock
from harness.jsonfile import read_json
from harness.schema.base import first_error
from harness.schema.image import (
    ExpectedRuntime,
    GateTally,
    GitPin,
    ImageHarness,
    ImageRuntime,
    ObservedRuntime,
)
from harness.schema.lock import SourceLock

M = TypeVar("M", bound=BaseModel)

DEFAULT_IMAGE_ROOT = Path("/opt/dcpqual/image")
DEFAULT_LOCK = Path("images/kimi-k3-cu133-torch213/source.lock.json")
# Components that are Python distributions in the image: name in the lock -> distribution.
PACKAGES = {"vllm": "vllm", "b12x": "b12x"}


def default_lock_path() -> Path:
    return Path(os.environ.get("DCPQUAL_LOCK") or DEFAULT_LOCK)


def default_image_root() -> Path:
    return Path(os.environ.get("DCPQUAL_IMAGE_ROOT") or DEFAULT_IMAGE_ROOT)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = read_json(path)
    except (OSError, ValueError):  # missing, hostile or not strict JSON: nothing to trust
        return None
    return data if isinstance(data, dict) else None


def _provenance(path: Path, model: type[M], notes: list[str]) -> M | None:
    """The provenance record at `path` as `model`; None (with a note) where there is none or
    it is not one."""
    data = _read_json(path)
    if data is None:
        return None
    try:
        return model.model_validate({k: None if v is None else str(v) for k, v in data.items()})
    except ValidationError as exc:
        notes.append(f"{path}: not a provenance record: {first_error(exc)}")
        return None


def observe(image_root: Path) -> ObservedRuntime:
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
    sources: dict[str, GitPin] = {}
    source_dir = image_root / "sources"
    if source_dir.is_dir():
        for path in sorted(source_dir.glob("*.json")):
            if (pin := _provenance(path, GitPin, notes)) is not None:
                sources[path.stem] = pin
    else:
        notes.append(f"no provenance folder {source_dir} (not inside a dcpqual image?)")
    build = _read_json(image_root / "build.json") or {}
    harness = None
    if isinstance(build.get("harness"), dict):
        try:
            harness = ImageHarness.model_validate(build["harness"])
        except ValidationError as exc:
            notes.append(f"build.json harness: {first_error(exc)}")
    lock_sha = build.get("lock_sha256")
    gates: list[GateTally] = []
    # The CPU gates ran in the build (in the image root); the GPU gates run on the node, in the
    # container, and name their report in DCPQUAL_GPU_GATES (the image root is read-only there).
    gpu_report = os.environ.get("DCPQUAL_GPU_GATES")  # harness.image.gates.GPU_REPORT_ENV
    for where in ("cpu", "gpu"):
        path = image_root / f"source-gates-{where}.json"
        if where == "gpu" and gpu_report:
            path = Path(gpu_report)
        if not path.is_file():
            continue
        try:
            data = read_json(path)
            gates += [GateTally.model_validate(item) for item in data]
        except (OSError, ValueError, TypeError, ValidationError) as exc:
            notes.append(f"{path}: not a source-gate report: {type(exc).__name__}")
    return ObservedRuntime(
        torch=torch.__version__,
        torch_commit=getattr(torch.version, "git_version", None),
        cuda=torch.version.cuda,
        nccl=nccl,
        arch=flags.split() if flags else [],
        cuda_available=available,
        devices=list(devices),
        packages=packages,
        sources=sources,
        image_lock_sha256=None if lock_sha is None else str(lock_sha),
        harness=harness,
        source_gates=gates,
        notes=notes,
    )


def expected_from(lock: SourceLock | None) -> ExpectedRuntime:
    """What a correct image holds, from the lock (nothing is expected without one, and the
    unreadable lock is itself a mismatch)."""
    if lock is None:
        return ExpectedRuntime()
    pytorch = lock.components.get("pytorch")
    return ExpectedRuntime(
        torch=lock.versions.torch,
        torch_commit=pytorch.source.commit if pytorch else None,
        cuda=lock.versions.cuda,
        nccl=lock.versions.nccl,
        arch="sm_" + lock.versions.torch_cuda_arch_list.replace(".", ""),
        sources={
            name: GitPin(commit=c.source.commit, tree=c.source.tree)
            for name, c in lock.components.items()
        },
        source_gates=sorted({f"{g.component}/{g.where}" for g in lock.source_gates}),
    )


def compare(
    expected: ExpectedRuntime, observed: ObservedRuntime, lock_sha256: str | None
) -> list[str]:
    """Every difference between `expected` and `observed`, one line each (pure)."""
    out: list[str] = []

    def differ(what: str, want: Any, got: Any) -> None:
        if want is not None and want != got:
            out.append(f"{what}: expected {want}, found {got if got is not None else 'none'}")

    differ("torch", expected.torch, observed.torch)
    differ("torch commit", expected.torch_commit, observed.torch_commit)
    differ("cuda", expected.cuda, observed.cuda)
    differ("nccl", expected.nccl, observed.nccl)
    arch = expected.arch
    if arch is not None and observed.arch != [arch]:
        found = " ".join(observed.arch) or "none (no CUDA build)"
        out.append(f"cuda arch: expected only {arch}, found {found}")
    for name, want in sorted(expected.sources.items()):
        got = observed.sources.get(name)
        if got is None:
            out.append(f"source {name}: no provenance in the image")
            continue
        pairs = (("commit", want.commit, got.commit), ("tree", want.tree, got.tree))
        for key, wanted, seen in pairs:
            if seen != wanted:
                out.append(f"source {name}: {key} expected {wanted}, found {seen}")
    for name, version in sorted(observed.packages.items()):
        if name in expected.sources and version is None:
            out.append(f"package {name}: not installed")
    for gate in observed.source_gates:
        if not gate.ok:
            why = gate.note or (
                f"{gate.passed} passed, {gate.failed} failed, {gate.errors} errors "
                f"(exit {gate.exit_code})"
            )
            out.append(f"source gate {gate.key}: {why}")
    ran = {g.key for g in observed.source_gates}
    for key in expected.source_gates:
        if key.endswith("/cpu") and key not in ran:
            out.append(f"source gate {key}: did not run in the image build")
    if lock_sha256 is not None and observed.image_lock_sha256 != lock_sha256:
        found = observed.image_lock_sha256 or "none (no build.json)"
        out.append(f"lock sha256: expected {lock_sha256}, the image was built with {found}")
    return out


def verify(lock_path: Path, image_root: Path | None = None) -> ImageRuntime:
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
    return ImageRuntime(
        ok=not mismatches,
        lock_path=str(lock_path),
        lock_sha256=lock_sha,
        image_lock_sha256=observed.image_lock_sha256,
        expected=expected,
        observed=observed,
        mismatches=mismatches,
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
        print(json.dumps(report.model_dump(mode="json", by_alias=True), indent=2, sort_keys=True))
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
