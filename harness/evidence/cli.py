"""Sub-commands of the evidence concern: `dcpqual verify DIR`, `dcpqual sign DIR`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.evidence.verify import verify_bundle
from harness.terminal import printable


def register(subparsers: Any) -> None:
    verify = subparsers.add_parser(
        "verify",
        help="re-check an evidence bundle: hashes, schema, consistency with its rank records",
        description=(
            "Re-check an evidence bundle: every hash, the receipt's schema, and the receipt "
            "against the rank records and JUnit reports it summarizes (re-derived, the first "
            "differing field named). Exit 0 when valid, 1 when invalid (one problem per "
            "line on stdout), 2 when DIR is not a folder. With --signature and --public-key, "
            "the bundle must also carry a valid detached signature by that key."
        ),
    )
    verify.add_argument("dir", type=Path, metavar="DIR", help="the bundle folder")
    verify.add_argument(
        "--signature", type=Path, metavar="FILE", help="detached signature (dcpqual sign)"
    )
    verify.add_argument(
        "--public-key", type=Path, metavar="PEM", help="Ed25519 public key that signed it"
    )
    verify.set_defaults(func=run_verify)

    sign = subparsers.add_parser(
        "sign",
        help="sign a valid bundle with an Ed25519 key (detached DSSE/in-toto signature)",
        description=(
            "Verify DIR, then write a detached signature of its SHA256SUMS (an in-toto "
            "statement in a DSSE envelope, Ed25519) to --out, default DIR.sig next to DIR. "
            "Exit 0 when written, 2 when DIR is invalid, the key unusable or --out exists."
        ),
    )
    sign.add_argument("dir", type=Path, metavar="DIR", help="the bundle folder")
    sign.add_argument(
        "--key", type=Path, required=True, metavar="PEM", help="unencrypted Ed25519 private key"
    )
    sign.add_argument("--out", type=Path, metavar="FILE", help="where to write the signature")
    sign.set_defaults(func=run_sign)


def run_verify(args: argparse.Namespace) -> int:
    if (args.signature is None) != (args.public_key is None):
        raise UsageError("--signature and --public-key go together")
    if args.signature is not None:
        from harness.evidence.signing import check_signature_inputs

        check_signature_inputs(args.signature, args.public_key)  # bad input: exit 2 first
    result = verify_bundle(args.dir)  # UsageError (exit 2) when DIR is unusable
    problems = list(result.problems)
    if args.signature is not None and not problems:
        from harness.evidence.signing import signature_problems

        problems += signature_problems(args.dir, args.signature, args.public_key)
    if not problems:
        signed = f" (signed, {args.signature})" if args.signature is not None else ""
        print(printable(f"{result.bundle}: valid{signed}"))
        return 0
    for problem in problems:  # a problem names files and texts the bundle's writer chose
        print(printable(problem, newlines=False))
    print(printable(f"{result.bundle}: INVALID ({len(problems)} problems)"), file=sys.stderr)
    return 1


def run_sign(args: argparse.Namespace) -> int:
    from harness.evidence.signing import default_signature_path, sign_bundle

    result = verify_bundle(args.dir)
    if not result.ok:
        raise UsageError(f"{args.dir} is not a valid bundle: {result.problems[0]}")
    out = args.out if args.out is not None else default_signature_path(args.dir)
    sign_bundle(args.dir, args.key, out)
    print(printable(f"{args.dir}: signed -> {out}"))
    return 0
