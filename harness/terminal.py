"""Text from a test or a bundle, made safe to print on a terminal.

A failure message, a test id or a file name in a bundle is written by whoever wrote the test or
the bundle; printed as it is, an escape sequence in it can erase the line before it and paint
another ("verdict FAIL" repainted as PASS). Every control character except the line breaks the
caller means is shown as its escape (`\\x1b`), so the text is still all there to read.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, and the C1 controls (0x9b is a one-byte CSI).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, *, newlines: bool = True) -> str:
    """`text` with every control character (newlines too unless `newlines`) escaped."""
    shown = _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)
    return shown if newlines else shown.replace("\n", "\\n")
