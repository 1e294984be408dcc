"""The README's command table and examples, held to the parser: every flag a `dcpqual ...` in
the README uses exists on that command, and every flag of the parser is in the README, so the
text cannot drift from what the commands take."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from harness.cli import build_parser

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
_SPAN = re.compile(r"`([^`\n]+)`")
_FLAG = re.compile(r"^(--?[A-Za-z][\w-]*)")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def commands_in_readme() -> list[tuple[str, list[str]]]:
    """(the command as written, its words) for every `dcpqual ...` in an inline code span or a
    fenced block's line, cut at a bare `--` (what follows is pytest's)."""
    texts = [m[1] for m in _SPAN.finditer(README)]
    in_fence = False
    for line in README.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        elif in_fence:
            texts.append(line)
    found = []
    for text in texts:
        for start in (m.end() for m in re.finditer(r"(?:^|[\s(])dcpqual ", text)):
            words = text[start:].replace("\\|", "|").split()
            words = words[: words.index("--")] if "--" in words else words
            found.append((text, words))
    return found


def _resolve(words: list[str]) -> tuple[argparse.ArgumentParser, list[str], str]:
    parser, path = build_parser(), "dcpqual"
    rest = list(words)
    while rest and rest[0] in _subparsers(parser):
        path += f" {rest[0]}"
        parser = _subparsers(parser)[rest.pop(0)]
    return parser, rest, path


def test_every_flag_the_readme_gives_a_command_exists() -> None:
    unknown = []
    seen = 0
    for text, words in commands_in_readme():
        parser, rest, path = _resolve(words)
        if path == "dcpqual":
            continue  # prose naming the program, not a command
        seen += 1
        for word in rest:
            match = _FLAG.match(word.lstrip("[{("))
            if match and match[1] not in _flags(parser):
                unknown.append(f"{path} {match[1]}  (in: {text[:80]})")
    assert seen > 20
    assert unknown == []


# Commands whose options another README documents: bench's size knobs are bench/README.md's.
ELSEWHERE = {"dcpqual bench"}


def test_every_flag_of_every_command_is_in_the_readme() -> None:
    missing = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        if path in ELSEWHERE:
            return
        for flag in sorted(_flags(parser) - {"-h", "--help"}):
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", README):
                missing.append(f"{path} {flag}")
        for name, sub in _subparsers(parser).items():
            walk(sub, f"{path} {name}")

    walk(build_parser(), "dcpqual")
    assert missing == []


def test_the_check_fires_on_a_flag_the_parser_does_not_have() -> None:
    parser, rest, path = _resolve(["run", "--nproc-per-node", "2", "--no-such-flag"])
    assert path == "dcpqual run"
    assert [w for w in rest if _FLAG.match(w) and w not in _flags(parser)] == ["--no-such-flag"]
