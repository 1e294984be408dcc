"""Just enough Dockerfile parsing to prove the Dockerfile and the lock agree.

The build driver passes build arguments computed from the lock; the Dockerfile declares ARGs and
LABELs. Reading the Dockerfile here lets tests (and the driver, before it talks to an engine)
check both directions: every argument passed is declared, every declared ARG is passed and used,
no ARG carries a default (a default would be a second copy of a pin), and the LABELs, with the
arguments substituted, are exactly the labels the driver expects on the built image.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, ARG, RUN, LABEL...
    value: str  # continuation lines joined with single spaces
    line: int  # 1-based line where the instruction starts


def instructions(text: str) -> list[Instruction]:
    """Instructions in order; comments dropped, backslash continuations joined."""
    out: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not parts and (not line or line.startswith("#")):
            continue
        if parts and line.startswith("#"):
            continue  # comment lines inside a continued instruction are skipped by Docker too
        if not parts:
            start = number
        if line.endswith("\\"):
            parts.append(line[:-1].strip())
            continue
        parts.append(line)
        joined = " ".join(p for p in parts if p)
        keyword, _, value = joined.partition(" ")
        out.append(Instruction(keyword.upper(), value.strip(), start))
        parts = []
    if parts:
        raise ValueError(f"Dockerfile ends inside a continued instruction (line {start})")
    return out


def declared_args(text: str) -> dict[str, str | None]:
    """Every ARG in any stage: name -> default (None when it has none)."""
    args: dict[str, str | None] = {}
    for ins in instructions(text):
        if ins.keyword != "ARG":
            continue
        for item in shlex.split(ins.value):
            name, eq, default = item.partition("=")
            args[name] = default if eq else args.get(name)
    return args


def referenced_names(text: str) -> set[str]:
    """Names used as $NAME or ${NAME} outside ARG lines (shell variables included)."""
    names: set[str] = set()
    for ins in instructions(text):
        if ins.keyword != "ARG":
            names.update(a or b for a, b in _VAR.findall(ins.value))
    return names


def undeclared_uses(text: str, names: set[str]) -> list[str]:
    """Uses of a build argument in a stage that did not declare it (Docker substitutes '')."""
    problems = []
    global_args: set[str] = set()
    declared: set[str] | None = None  # None: before the first FROM
    stage = ""
    for ins in instructions(text):
        if ins.keyword == "ARG":
            new = {item.partition("=")[0] for item in shlex.split(ins.value)}
            (global_args if declared is None else declared).update(new)
            continue
        used = {a or b for a, b in _VAR.findall(ins.value)} & names
        if ins.keyword == "FROM":
            words = ins.value.split()
            stage = words[2] if len(words) >= 3 and words[1].upper() == "AS" else ins.value
            scope, declared = global_args, set()
        else:
            scope = declared or set()
        for name in sorted(used - scope):
            problems.append(f"line {ins.line}: ${name} used in stage {stage} without ARG {name}")
    return problems


def substitute(value: str, env: Mapping[str, str]) -> str:
    """Docker-style $NAME/${NAME} substitution; an unknown name is an error, not ''."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in env:
            raise KeyError(f"${name} is not a build argument")
        return env[name]

    return _VAR.sub(one, value)


def labels(text: str, args: Mapping[str, str], stage: str | None = None) -> dict[str, str]:
    """LABELs of the last stage (or `stage`), with build arguments substituted."""
    stages: dict[str, list[Instruction]] = {}
    current: list[Instruction] | None = None
    last = ""
    for ins in instructions(text):
        if ins.keyword == "FROM":
            words = ins.value.split()
            last = words[2] if len(words) >= 3 and words[1].upper() == "AS" else ins.value
            current = stages.setdefault(last, [])
        elif current is not None:
            current.append(ins)
    found: dict[str, str] = {}
    for ins in stages.get(stage or last, []):
        if ins.keyword != "LABEL":
            continue
        for item in shlex.split(ins.value):
            key, eq, value = item.partition("=")
            if not eq:
                raise ValueError(f"LABEL item {item!r} (line {ins.line}) is not KEY=VALUE")
            found[substitute(key, args)] = substitute(value, args)
    return found


def read(path: Path) -> str:
    return Path(path).read_text(encoding="utf-8")
