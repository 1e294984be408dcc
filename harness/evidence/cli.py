"""Sub-commands of the evidence concern: `dcpqual verify DIR`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harness.evidence.verify import verify_bundle


def register(subparsers: Any) -> None:
    verify = subparsers.add_parser(
        "verify",
        help="re-check an evidence bundle: hashes, schema, internal consistency",
        description=(
            "Re-check an evidence bundle. Exit 0 when valid, 1 when invalid (one problem per "
            "line on stdout), 2 when DIR is not a folder."
        ),
    )
    verify.add_argument("dir", type=Path, metavar="DIR", help="the bundle folder")
    verify.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    result = verify_bundle(args.dir)  # UsageError (exit 2) when DIR is unusable
    if result.ok:
        print(f"{result.bundle}: valid")
        return 0
    for problem in result.problems:
        print(problem)
    print(f"{result.bundle}: INVALID ({len(result.problems)} problems)", file=sys.stderr)
    return 1
