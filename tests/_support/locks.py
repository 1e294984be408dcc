"""Source locks for the image tests: the shipped template pinned with well-formed values, and
scratch git repositories to pin from."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

DELETE = object()  # `set_at(data, path, DELETE)` removes the key

TEMPLATE = Path(__file__).resolve().parents[2] / "images/kimi-k3-cu133-torch213/source.lock.json"


def fake_hex(seed: str, n: int = 40) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:n]


def pinned_lock_data() -> dict[str, Any]:
    """The shipped template with every placeholder replaced by a well-formed pin."""
    data = json.loads(TEMPLATE.read_text())
    data["foundation"]["image"]["digest"] = "sha256:" + fake_hex("base", 64)
    data["versions"]["nccl"] = "2.28.9"
    data["versions"]["triton"] = "3.7.0"
    data["vllm_build"]["rust_toolchain"] = "1.92.0"
    refs = {"nccl": "refs/tags/v2.28.9-1", "b12x": "refs/tags/v1.5.1"}
    for name, comp in data["components"].items():
        src = comp["source"]
        src["commit"], src["tree"] = fake_hex(f"{name}-commit"), fake_hex(f"{name}-tree")
        if "<" in src["repository"]:
            src["repository"] = f"https://example.org/{name}.git"
        if "<" in src["ref"]:
            src["ref"] = refs.get(name, "refs/heads/dcp-warmup")
        if comp["upstream_base"]:
            comp["upstream_base"]["commit"] = fake_hex(f"{name}-base")
    return data


def prebuilt_foundation_lock_data() -> dict[str, Any]:
    """A pinned lock on a prebuilt foundation image (CUDA 13.4.1 / torch 2.14 pre-release):
    no nccl or pytorch component, the foundation held to labels naming its versions."""
    data = pinned_lock_data()
    data["image"] = "kimi-k3-cu134-torch214"
    data["foundation"] = {
        "kind": "image",
        "image": {
            "reference": "example.org/blackwell/foundation:cu134-torch214",
            "digest": "sha256:" + fake_hex("foundation", 64),
        },
        "labels": {
            "local-inference.cuda.version": "13.4.1",
            "local-inference.torch.version": "2.14.0a0",
            "local-inference.nccl.version": "2.30.4",
        },
    }
    data["versions"].update(cuda="13.4", torch="2.14.0a0", nccl="2.30.4", triton="3.8.0")
    for name in ("nccl", "pytorch"):
        del data["components"][name]
    return data


def write_lock(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    cmd += ["-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "init")
    return path


def set_at(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set (or, with `DELETE`, remove) the value at a dotted path such as `a.0.b`."""
    *parents, last = dotted.split(".")
    node: Any = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
