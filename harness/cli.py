"""`dcpqual` entry point: one argparse parser, sub-commands registered by their own packages.

Each concern owns its sub-commands in a small `cli` module exposing
`register(subparsers) -> None`; the handler it sets as `func` takes the parsed namespace and
returns an exit code. Errors derived from `DcpqualError` become one line on stderr, scrubbed of
secrets as the launcher's console is: an error may echo an argument, a path or a file's content.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from harness import __version__
from harness.core.secrets import environment_scrubber, register_command_line
from harness.errors import DcpqualError
from harness.terminal import printable

# Modules that contribute sub-commands, in the order they appear in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "harness.launch.cli",  # run
    "harness.launch.logs_cli",  # logs
    "harness.models.cli",  # signatures
    "harness.evidence.cli",  # verify
    "harness.qualify.cli",  # compare, nightly
    "harness.image.cli",  # lock check, lock pin, image build
    "harness.bench.cli",  # bench
    "harness.smoke.cli",  # gpu-smoke
    "harness.schema.cli",  # schema
)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we print one line (usage stays in --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, _scrubbed(f"{self.prog}: error: {message} (see --help)") + "\n")


def _scrubbed(line: str) -> str:
    return printable(environment_scrubber().text(line)[0], newlines=False)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="dcpqual",
        description="Qualify B12X DCP transport warmup on multi-rank torchrun jobs.",
    )
    parser.add_argument("--version", action="version", version=f"dcpqual {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # that concern has no commands yet
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    typed = sys.argv[1:] if argv is None else argv
    register_command_line(typed)  # before parsing: an argument error's line is scrubbed too
    parser = build_parser()
    args = parser.parse_args(argv)
    register_command_line(typed, file_names=_file_names(args))
    try:
        return int(args.func(args))
    except DcpqualError as exc:
        print(_scrubbed(f"dcpqual {args.command}: error: {exc}"), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"dcpqual {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_gone()


def _file_names(args: argparse.Namespace) -> set[str]:
    """What the parser took as file names, as typed (an option of `type=Path`)."""
    return {str(v) for v in vars(args).values() if isinstance(v, Path)}


# The exit status of a process a closed pipe ended (128 + SIGPIPE), as a shell reports it.
BROKEN_PIPE_EXIT = 141


def _reader_gone() -> int:
    """The reader of stdout left (`dcpqual logs B | head`): end quietly, as `cat` would, and
    keep the interpreter's flush at exit from raising again on the closed pipe."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (a test's capture): nothing to flush
        pass
    return BROKEN_PIPE_EXIT


if __name__ == "__main__":
    raise SystemExit(main())
