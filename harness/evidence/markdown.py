"""Escaping for values from a run (test ids, messages, host names) placed into Markdown.

summary.md is pasted into pull requests, and everything in it that came from a run can be
chosen by whoever wrote the tests: a test id like ``t[`](http://x)]`` must stay one inline code
span, a message must not open a link, an HTML tag, a heading or a new list item. CommonMark
(and GitHub's dialect of it) lets any ASCII punctuation be backslash-escaped, and makes a code
span end only at a backtick run of its opening length; both are used here.
"""

from __future__ import annotations

import re

# Characters with inline meaning in CommonMark or GitHub Markdown: emphasis, code, links,
# images, raw HTML, entities, tables, strikethrough, math.
_INLINE = re.compile(r"([\\`*_\[\]<>|~&$!])")
# Markers that start a block when they open a line (or the content of a list item).
_BLOCK_START = re.compile(r"^(\s*(?:\d+)?)([#>+=.)-])")
_BREAKS = re.compile(r"[\r\n\t\v\f\u2028\u2029]+")
_UNESCAPED_PIPE = re.compile(r"(?<!\\)((?:\\\\)*)\|")


def one_line(value: object) -> str:
    """The value as one line of text: line breaks become spaces."""
    return _BREAKS.sub(" ", str(value))


def text(value: object) -> str:
    """Plain text that renders as itself wherever inline Markdown is allowed."""
    escaped = _INLINE.sub(r"\\\1", one_line(value))
    return _BLOCK_START.sub(r"\1\\\2", escaped)


def code(value: object) -> str:
    """An inline code span showing `value` exactly, whatever backticks it holds."""
    body = one_line(value)
    if not body:
        return ""  # an empty code span is no code span
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    spaced = body[:1] == " " and body[-1:] == " " and body.strip(" ")
    if body.startswith("`") or body.endswith("`") or spaced:
        body = f" {body} "  # CommonMark strips one space on each side of such a span
    return f"{fence}{body}{fence}"


def cell(markdown: str) -> str:
    """Markdown made safe inside a GFM table cell: a pipe there ends the cell even in code."""
    return _UNESCAPED_PIPE.sub(r"\1\\|", one_line(markdown))
