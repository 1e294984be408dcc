"""Scrubbing a stream as it is written: what of a growing text may be written out now, scrubbed,
and what must wait for more bytes.

Why: a rank's output reaches the disk while the run goes on. Scrubbed only at the end, a
launcher killed by SIGKILL (or the OOM killer) leaves every secret a test printed in torchrun's
log files. Scrubbed as written, the file never holds one, but a stream arrives in arbitrary
pieces: a secret written in two `write`s, a `NAME=value` whose value is still to come, a base64
encoding wrapped over several lines. So a piece is written out only up to a point where nothing
scrubbed could straddle it: the end of the last whole line (a shape lies within a line), before
any form of a secret that the written part would cut or that more bytes could complete, and not
inside a run of wrapped base64 lines (the scrubber joins them to find an encoding), and not
between a pytest diff's note that it skipped identical characters and the diff's lines (the
scrubber reads the note to find a piece of a secret at a line's edge). The rest waits; at the
end of the stream it is scrubbed as it is.

Bounded: an unfinished line longer than `LONGEST_LINE` is cut at its last blank (else `longest`
bytes from its end), moved back before any `NAME=` or `NAME:` in the last `ASSIGNMENT_REACH`
bytes (so a name and its value never land on two sides of a cut); a run of wrapped base64 longer
than `LONGEST_HOLD` is cut at a line end; a diff is held for at most `DIFF_LINES` lines and
`LONGEST_HOLD` bytes. So memory stays bounded whatever a test prints. A
secret's form cut by such a forced cut (an encoding that straddles the cut of a run of over 1 MiB,
a value of over `ASSIGNMENT_REACH` bytes with blanks in it) reaches the file in two pieces; the
scrub of the whole file at the run's ending still finds it there.
"""

from __future__ import annotations

import re
from collections import defaultdict

from harness.core.secrets import Scrubber, diff_open

# A line of wrapped base64 (64 or 76 characters and its break): never a place to cut, so a
# wrapped encoding of a secret is scrubbed in one piece.
WRAPPED_LINE_END = re.compile(rb"[A-Za-z0-9+/_=-]{64,}\r?\n\Z")
LONGEST_LINE = 64 << 10
LONGEST_HOLD = 1 << 20
ASSIGNMENT_REACH = 1024
# A name being assigned (`NAME=`, `NAME: `, `"NAME": `, any case): a forced cut is moved before it.
_ASSIGNMENT = re.compile(rb"(?<![A-Za-z0-9_.-])[A-Za-z_][A-Za-z0-9_.-]*[\"']?[ \t]*[=:]")


def _by_first(forms: list[bytes]) -> dict[int, tuple[bytes, ...]]:
    """`forms` grouped by their first byte."""
    grouped: defaultdict[int, list[bytes]] = defaultdict(list)
    for form in forms:
        grouped[form[0]].append(form)
    return {first: tuple(group) for first, group in grouped.items()}


# pytest's note before a diff whose lines start or end at a cut (`secrets._DIFF_SKIP`).
_DIFF_NOTE = b" identical "


def _before_open_diff(buffer: bytes | bytearray, cut: int) -> int:
    """`cut`, or the start of the line of a diff note in `buffer[:cut]` whose diff may go on
    past `cut` (no empty line after it yet, nor DIFF_LINES lines); of the first such note where
    two come one after the other (leading and trailing characters skipped)."""
    note = buffer.rfind(_DIFF_NOTE, 0, cut)
    if note == -1:
        return cut
    start = buffer.rfind(b"\n", 0, note) + 1
    text = bytes(buffer[start:cut]).decode("utf-8", "surrogateescape")
    if not diff_open(text):
        return cut
    while start:
        before = buffer.rfind(b"\n", 0, start - 1) + 1
        if not diff_open(bytes(buffer[before:start]).decode("utf-8", "surrogateescape")):
            break
        start = before
    return start


class LiveScrub:
    """One stream's scrub: `feed` each piece as it comes, write what it returns; `end` once the
    stream closed, write that too. What it holds back is at most a line, a run of wrapped
    base64 or a form's prefix (bounded, see the module's docstring)."""

    def __init__(self, scrubber: Scrubber) -> None:
        self.scrubber = scrubber
        forms = [f.encode("utf-8") for f in scrubber.forms]
        self.longest = max((len(f) for f in forms), default=0)
        self.by_first = _by_first(forms)
        # A cut right after a line break is straddled only by a form that holds one.
        self.by_first_multiline = _by_first([f for f in forms if b"\n" in f])
        self.held = bytearray()
        self.wrapped = 0  # how many bytes at the start of `held` are whole wrapped-base64 lines
        self.diff_held = False  # the last cut was moved before a diff that may go on

    def safe_end(self, buffer: bytes | bytearray) -> int:
        """How much of `buffer` may be scrubbed and written now (see the module's docstring)."""
        last = buffer.rfind(b"\n")
        cut = self._after_last_whole_line(buffer, last)
        if len(buffer) - (last + 1) > LONGEST_LINE:  # the unfinished line alone is too long
            cut = self._forced_cut(buffer, last + 1)
        self.diff_held = False
        if self.longest and len(buffer) <= LONGEST_HOLD:
            before = _before_open_diff(buffer, cut)
            self.diff_held, cut = before < cut, min(cut, before)
        candidates = self.by_first_multiline if buffer[cut - 1 : cut] == b"\n" else self.by_first
        if not candidates:
            return cut
        for start in range(max(0, cut - self.longest), cut):
            for form in candidates.get(buffer[start], ()):
                piece = buffer[start : start + len(form)]
                straddles = piece == form and start + len(form) > cut
                may_complete = len(piece) < len(form) and form.startswith(piece)
                if straddles or may_complete:
                    return start
        return cut

    def _after_last_whole_line(self, buffer: bytes | bytearray, last: int) -> int:
        """Where the last whole line ends that is not a line of wrapped base64 (0: none yet); past
        `LONGEST_HOLD`, where the last line ends, whatever it is. The first `self.wrapped` bytes
        are known to be such lines already: only the lines after them are looked at."""
        at = last
        while at >= self.wrapped and WRAPPED_LINE_END.search(buffer[max(0, at - 80) : at + 1]):
            at = buffer.rfind(b"\n", 0, at)
        if at < self.wrapped:
            at = -1
        if at == -1 and len(buffer) > LONGEST_HOLD:
            at = last
        return at + 1

    def _forced_cut(self, buffer: bytes | bytearray, line_start: int) -> int:
        """A cut inside the unfinished line that starts at `line_start`: after its last blank,
        before any assignment shortly before that blank (else `longest` bytes from the end)."""
        blank = max(buffer.rfind(b" ", line_start), buffer.rfind(b"\t", line_start))
        cut = blank + 1 if blank > line_start else max(len(buffer) - self.longest, line_start)
        reach = buffer[max(line_start, cut - ASSIGNMENT_REACH) : cut]
        names = list(_ASSIGNMENT.finditer(reach))
        if names:
            before = cut - len(reach) + names[-1].start()
            if before > line_start:
                cut = before
        return cut

    def feed(self, piece: bytes) -> bytes:
        """The scrubbed bytes that `piece` (after what was held) lets through now."""
        self.held += piece  # in place: a long held run is not copied at every piece
        buffer = self.held
        cut = self.safe_end(buffer)
        at_line_end = cut == 0 or buffer[cut - 1 : cut] == b"\n"
        out = bytes(buffer[:cut])
        del self.held[:cut]
        last = self.held.rfind(b"\n")
        # What is held now up to its last line break is a run of wrapped base64 lines where the
        # cut was the usual one (after the last other line); otherwise look at it all again.
        whole = last + 1
        self.wrapped = whole if at_line_end and not self.diff_held else 0
        if self.wrapped and not WRAPPED_LINE_END.search(self.held[max(0, last - 80) : whole]):
            self.wrapped = 0
        return self.scrubber.data(out)[0] if out else b""

    def end(self) -> bytes:
        """The stream closed: what was held, scrubbed as it is."""
        rest, self.held, self.wrapped = bytes(self.held), bytearray(), 0
        return self.scrubber.data(rest)[0] if rest else b""
