"""`dcpqual logs BUNDLE [--rank N] [--stderr|--stacks] [--grep PATTERN]`: read rank logs by
global rank.

Reads `logs/rank-NN.<stream>` that `dcpqual run` puts in every bundle. Without --grep each
chosen rank's log is printed under a `==> rank N (file) <==` header (tail's habit); with --grep
only matching lines, as `rank-NN.stderr:LINE:text` (grep -n's habit). Exit 0 when something was
printed, 1 when --grep matched nothing, 2 on unusable input.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from harness.errors import UsageError
from harness.launch.ranklogs import log_name
from harness.schema.layout import LOGS_DIR, STACKS_DIR, rank_file_name

_RANK_FILE = re.compile(r"^rank-(\d+)\.(stdout|stderr)$")
_STACKS_FILE = re.compile(r"^rank-(\d+)\.txt$")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "logs",
        help="print a bundle's rank logs by global rank",
        description=(
            "Print the rank logs of an evidence bundle (logs/rank-NN.stdout, .stderr, "
            "stacks/rank-NN.txt) "
            "by global rank. Exit 0 when something was printed, 1 when --grep matched nothing, "
            "2 on unusable input."
        ),
    )
    p.add_argument("bundle", type=Path, metavar="BUNDLE", help="the evidence folder")
    p.add_argument("--rank", default=None, metavar="N", help="only this global rank")
    stream = p.add_mutually_exclusive_group()
    stream.add_argument("--stderr", action="store_true", help="stderr instead of stdout")
    stream.add_argument(
        "--stacks", action="store_true", help="the stack dumps of a timeout or abort"
    )
    p.add_argument("--grep", default=None, metavar="PATTERN", help="only lines matching a regex")
    p.set_defaults(func=logs_command)


def available(bundle: Path, stream: str) -> dict[int, Path]:
    """Global rank -> its log file for `stream`, as the bundle holds them (the stack dumps in
    stacks/rank-NN.txt, where the ranks write them by global rank)."""
    folder = bundle / LOGS_DIR
    if not bundle.is_dir():
        raise UsageError(f"{bundle} is not a folder")
    if not folder.is_dir():
        raise UsageError(f"{bundle} has no {LOGS_DIR}/ folder (not a dcpqual run bundle?)")
    pattern = _STACKS_FILE if stream == "stacks" else _RANK_FILE
    where = bundle / STACKS_DIR if stream == "stacks" else folder
    found: dict[int, Path] = {}
    for path in where.iterdir() if where.is_dir() and not where.is_symlink() else ():
        match = pattern.match(path.name)
        wanted = match is not None and (stream == "stacks" or match[2] == stream)
        if match and wanted and path.is_file() and not path.is_symlink():
            found[int(match[1])] = path
    return dict(sorted(found.items()))


def _file_name(rank: int | str, stream: str) -> str:
    if stream == "stacks":
        return (
            f"{STACKS_DIR}/{rank_file_name(rank, '.txt')}"
            if isinstance(rank, int)
            else f"{STACKS_DIR}/rank-{rank}.txt"
        )
    return (
        f"{LOGS_DIR}/{log_name(rank, stream)}"
        if isinstance(rank, int)
        else f"{LOGS_DIR}/rank-{rank}.{stream}"
    )


def logs_command(args: argparse.Namespace) -> int:
    stream = "stderr" if args.stderr else "stacks" if args.stacks else "stdout"
    pattern = None
    if args.grep is not None:
        try:
            pattern = re.compile(args.grep)
        except re.error as exc:
            raise UsageError(f"--grep {args.grep!r} is not a regular expression: {exc}") from None
    files = available(args.bundle, stream)
    if not files:  # nothing would be printed: exit 0 would read as "here they are"
        raise UsageError(f"{args.bundle} has no {_file_name('NN', stream)} files")
    if args.rank is not None:
        try:
            rank = int(args.rank)
        except ValueError:
            raise UsageError(f"--rank must be an integer, got {args.rank!r}") from None
        if rank not in files:
            have = ", ".join(map(str, files)) or "none"
            raise UsageError(f"no {_file_name(rank, stream)} in {args.bundle} (ranks: {have})")
        files = {rank: files[rank]}
    out = sys.stdout
    matched = 0
    for rank, path in files.items():
        text = path.read_text(encoding="utf-8", errors="replace")
        if pattern is None:
            out.write(f"==> rank {rank} ({path.parent.name}/{path.name}) <==\n")
            out.write(text if text.endswith("\n") or not text else text + "\n")
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                out.write(f"{path.name}:{number}:{line}\n")
                matched += 1
    out.flush()
    return 1 if pattern is not None and not matched else 0
