"""Read git identity (commit and tree) from a local checkout.

Identity in this project is a commit *and* its tree, never a branch or tag name, so the lock pinner
and the build driver both ask git directly rather than trusting a ref. Every failure becomes a
`UsageError` naming the checkout, because a wrong path is the usual cause.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UsageError


@dataclass(frozen=True)
class GitIdentity:
    """The commit HEAD points at, its tree, and whether the working tree differs from it."""

    commit: str
    tree: str
    dirty: bool

    def to_json(self) -> dict[str, object]:
        return {"commit": self.commit, "tree": self.tree, "dirty": self.dirty}


def git(repo: Path, *args: str) -> str:
    """Run one git command in `repo` and return its stripped stdout; errors are UsageErrors."""
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError as exc:  # no git binary at all
        raise UsageError(f"git is not installed: {exc}") from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise UsageError(f"git {' '.join(args)} in {repo}: {reason}")
    return done.stdout.strip()


def resolve_commit(repo: Path, ref: str) -> str | None:
    """The commit `ref` names in `repo`, or None when the checkout does not know that ref."""
    done = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def identity(repo: Path) -> GitIdentity:
    """Commit, tree and dirtiness of the checkout at `repo` (untracked files count as dirty)."""
    if not repo.is_dir():
        raise UsageError(f"not a directory: {repo}")
    git(repo, "rev-parse", "--git-dir")  # one clear error when it is no git checkout
    commit = git(repo, "rev-parse", "HEAD")
    tree = git(repo, "rev-parse", "HEAD^{tree}")
    status = git(repo, "status", "--porcelain", "--untracked-files=normal")
    return GitIdentity(commit=commit, tree=tree, dirty=bool(status))


def tracked_files(repo: Path) -> list[str]:
    """Paths of tracked files that exist in the working tree, sorted (the build context)."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached"],
        capture_output=True,
        check=False,
    )
    if out.returncode != 0:
        raise UsageError(f"git ls-files in {repo}: {out.stderr.decode(errors='replace').strip()}")
    names = [n for n in out.stdout.decode().split("\0") if n]
    return sorted(n for n in set(names) if (repo / n).is_file() or (repo / n).is_symlink())
