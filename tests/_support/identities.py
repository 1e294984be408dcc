"""Image identities and GPUs as the image tests and the security tests need them."""

from __future__ import annotations

import json
from pathlib import Path

from harness.image.gpu_run import GpuInfo
from harness.image.identity import ImageIdentity
from harness.image.lock import lock_sha256

IMAGE_ID = "sha256:" + "e" * 64
RTX = GpuInfo(0, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, "590.10")


def make_identity(lock_file: Path, runtime_ok: bool = True) -> ImageIdentity:
    return ImageIdentity(
        reference="dcpqual/kimi-k3-cu133-torch213:lock-0123456789ab",
        image_id=IMAGE_ID,
        digest=IMAGE_ID,
        repo_digests=(),
        image="kimi-k3-cu133-torch213",
        lock_path=str(lock_file),
        source_lock_sha256=lock_sha256(lock_file),
        base_image="nvidia/cuda:13.3.0-cudnn-devel-ubuntu24.04@sha256:" + "1" * 64,
        versions={"cuda": "13.3", "torch": "2.13.0", "nccl": "2.28.9"},
        torch_cuda_arch_list="12.0a",
        sources={
            "pytorch": {
                "repository": "r",
                "ref": "refs/tags/v2.13.0",
                "commit": "a" * 40,
                "tree": "b" * 40,
            }
        },
        harness={"commit": "c" * 40, "tree": "d" * 40, "dirty": False},
        labels={"io.dcpqual.lock.sha256": lock_sha256(lock_file)},
        built_at="2026-01-01T00:00:00Z",
        runtime={
            "ok": runtime_ok,
            "lock_sha256": lock_sha256(lock_file),
            "mismatches": [] if runtime_ok else ["cuda: expected 13.3, found none"],
        },
    )


def write_identity(path: Path, identity: ImageIdentity) -> Path:
    path.write_text(json.dumps(identity.to_json()))
    return path
