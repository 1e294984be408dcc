"""argparse behaviour the sub-commands share (`dcpqual run`'s options, `dcpqual signatures`'
geometry): standard library only, so every package may use it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


class SingleValue(argparse.Action):
    """Store an option's text, refusing a second, different value under any of its spellings.

    argparse keeps the last of `--tp 2 --tensor-parallel-size 4` silently; a run must not
    qualify a geometry the user contradicted. The same value given twice is accepted. Values
    are compared as the option parses them (`--tp 4 --tp 04` agree) when `same` is given.
    """

    def __init__(
        self, *args: Any, same: Callable[[str, str], bool] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._same = same or (lambda a, b: a == b)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: dict[str, tuple[str, str]] = namespace.__dict__.setdefault("_given_as", {})
        earlier = given.get(self.dest)
        if earlier is not None and not self._same(earlier[1], values):
            raise argparse.ArgumentError(
                self,
                f"given twice with different values: {earlier[0]} {earlier[1]} and "
                f"{option_string} {values}; give it once",
            )
        given[self.dest] = (option_string or self.dest, values)
        setattr(namespace, self.dest, values)
