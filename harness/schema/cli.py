"""`dcpqual schema NAME`: print the JSON Schema of one on-disk format."""

from __future__ import annotations

import argparse
import sys

from harness.schema import SCHEMAS, schema_text


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    names = ", ".join(f"{name} ({spec.id})" for name, spec in SCHEMAS.items())
    p = subparsers.add_parser(
        "schema",
        help="print the JSON Schema of an on-disk format",
        description=(
            f"Print the JSON Schema of one format: {names}. The same text is committed as "
            "schemas/NAME.json."
        ),
    )
    p.add_argument("name", choices=sorted(SCHEMAS), metavar="NAME", help=", ".join(sorted(SCHEMAS)))
    p.set_defaults(func=run_schema)


def run_schema(args: argparse.Namespace) -> int:
    sys.stdout.write(schema_text(args.name))
    return 0
