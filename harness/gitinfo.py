"""Read git identity (commit, tree, dirtiness) from a local checkout: the one git reader.

Identity in this project is a commit *and* its tree, never a branch or tag name, so the lock pinner,
the build driver and the evidence writer all ask git directly rather than trusting a ref. Every
failure becomes a `UsageError` naming the checkout, because a wrong path is the usual cause;
callers that must not fail (the evidence writer) catch it and record the identity as unknown.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UsageError

GIT_TIMEOUT_S = 30.0


# The checkout (or install) that holds this harness, and how many differing paths a receipt
# shows a reviewer.
HARNESS_ROOT = Path(__file__).resolve().parents[1]
DIRTY_PATHS_SHOWN = 20


@dataclass(frozen=True)
class GitIdentity:
    """The commit HEAD points at, its tree, and whether the working tree differs from it."""

    commit: str
    tree: str
    dirty: bool
    dirty_paths: tuple[str, ...] = ()  # what differs, in `git status` order


def _run(repo: Path, *args: str) -> str:
    """One git command in `repo`; its stdout as is. Errors are UsageErrors."""
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            # `git status` would otherwise refresh the index under index.lock, racing the
            # commits of whoever works in this checkout.
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
    except FileNotFoundError as exc:  # no git binary at all
        raise UsageError(f"git is not installed: {exc}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"git {' '.join(args)} in {repo}: {exc}") from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise UsageError(f"git {' '.join(args)} in {repo}: {reason}")
    return done.stdout


def git(repo: Path, *args: str) -> str:
    """Run one git command in `repo` and return its stripped stdout; errors are UsageErrors."""
    return _run(repo, *args).strip()


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
    commit = git(repo, "rev-parse", "--verify", "HEAD")
    tree = git(repo, "rev-parse", "--verify", "HEAD^{tree}")
    # Not stripped: a porcelain line starts with its status columns, which may be blanks.
    status = _run(repo, "status", "--porcelain=v1", "--untracked-files=normal")
    paths = tuple(line[3:] for line in status.splitlines() if line.strip())
    return GitIdentity(commit=commit, tree=tree, dirty=bool(paths), dirty_paths=paths)


def checkout_identity(root: Path = HARNESS_ROOT) -> GitIdentity | None:
    """The identity of the git checkout whose top is `root` (by default the harness's own);
    None where it is none: installed into a venv that sits inside another repo, no git, no
    commit yet."""
    try:
        if toplevel(root) != root.resolve():
            return None
        return identity(root)
    except UsageError:
        return None


def toplevel(repo: Path) -> Path:
    """The top of the checkout `repo` lies in."""
    return Path(git(repo, "rev-parse", "--show-toplevel")).resolve()


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
