"""`pip check` held to a committed allowlist, and which distribution b12x comes from.

`python -m harness.image.pipcheck --allowlist FILE [--b12x-from repository|flashinfer-python]`
runs `pip check` in this environment. Every line it reports must be named by the allowlist
(`DIST -> REQUIREMENT  # why`, the reason required), else exit 1 listing the rest. The lock
decides the pins the fork and b12x disagree on (b12x installed without its dependencies), so pip
check is expected to name exactly those conflicts and nothing else.

With `--b12x-from`, the `b12x` import package must belong to exactly one installed distribution,
the expected one: flashinfer-python 0.7.1 also ships a top-level `b12x`, and installing both
would mix the two packages' files.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.image.requirements import normalize

_HAS = re.compile(r"^(\S+) \S+ has requirement ([A-Za-z0-9._-]+)")
_REQUIRES = re.compile(r"^(\S+) \S+ requires ([A-Za-z0-9._-]+), which is not installed")
_ENTRY = re.compile(r"^\s*(\S+)\s*->\s*(\S+)\s*#\s*(\S.*)$")
B12X_DISTRIBUTIONS = {"repository": "b12x", "flashinfer-python": "flashinfer-python"}


@dataclass(frozen=True)
class Allowed:
    dist: str
    requirement: str
    why: str


def parse_allowlist(text: str) -> list[Allowed]:
    """Entries `DIST -> REQUIREMENT  # why`; a line without a reason is an error."""
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        found = _ENTRY.match(line)
        if found is None:
            raise ValueError(f"allowlist line {number}: want 'DIST -> REQUIREMENT  # why'")
        entries.append(Allowed(normalize(found[1]), normalize(found[2]), found[3].strip()))
    return entries


def key_of(line: str) -> tuple[str, str] | None:
    """(distribution, requirement) a pip check line is about; None for a line of another form."""
    found = _HAS.match(line) or _REQUIRES.match(line)
    return (normalize(found[1]), normalize(found[2])) if found else None


def unexpected(report: str, allowed: Sequence[Allowed]) -> list[str]:
    """The pip check lines no allowlist entry names (a line of unknown form is never allowed)."""
    keys = {(a.dist, a.requirement) for a in allowed}
    out = []
    for line in report.splitlines():
        if not line.strip() or line.startswith("No broken requirements"):
            continue
        if key_of(line) not in keys:
            out.append(line.strip())
    return out


def b12x_problem(
    expected: str,
    owners: Callable[[], Mapping[str, list[str]]] = importlib.metadata.packages_distributions,
) -> str | None:
    """Why the `b12x` package is not the expected distribution's alone; None when it is."""
    want = B12X_DISTRIBUTIONS[expected]
    found = sorted({normalize(d) for d in owners().get("b12x", [])})
    if found == [want]:
        return None
    return f"b12x is provided by {', '.join(found) or 'nothing'}; the lock says {want} only"


def run_pip_check() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False
    )
    return done.stdout + done.stderr


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.image.pipcheck")
    parser.add_argument("--allowlist", required=True, type=Path)
    parser.add_argument("--b12x-from", choices=sorted(B12X_DISTRIBUTIONS), default=None)
    args = parser.parse_args(argv)
    try:
        allowed = parse_allowlist(args.allowlist.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"pipcheck: error: {args.allowlist}: {exc}", file=sys.stderr)
        return 2
    problems = [f"pip check: {line}" for line in unexpected(run_pip_check(), allowed)]
    if args.b12x_from and (why := b12x_problem(args.b12x_from)):
        problems.append(why)
    for line in problems:
        print(f"pipcheck: {line}", file=sys.stderr)
    print(f"pipcheck: {'ok' if not problems else f'{len(problems)} problem(s)'}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
