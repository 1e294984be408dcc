"""A secret that a printer cut short is scrubbed in the pieces the cut left: pytest's assertion
introspection shortens each side to a few characters around an ellipsis (`saferepr`), and its
diff of two long strings skips their identical leading or trailing characters, so a URL that
carries a token prints only a piece of it, which no whole form matches. Pieces are scrubbed where
the cut shows (beside `...` or `…`, at the edge of the diff's lines), as the file is scrubbed and
as a stream is written line by line; ordinary ellipses and diffs stay as they are."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from _pytest._io.saferepr import saferepr
from _support.leaks import pieces_in

from harness.core.livescrub import LiveScrub
from harness.core.secrets import FRAGMENT_MIN, SCRUBBED, Scrubber

TOKEN = "hf_QwRtYuPkMnBvCxZsDfGhJkLwErTyUpAs"
SCRUBBER = Scrubber.of([TOKEN])


# Failed comparisons whose diff skips identical characters before or after the token, written
# as the suite would: computed from the token (in T), so the source line pytest shows holds none.
PAIRS = {
    "leading": ("URL + '&page=1'", "URL + '&page=2'"),
    "at_the_end": ("URL + '1'", "URL + '2'"),
    "trailing": ("'a=1' + T + 'y' * 20", "'a=2' + T + 'y' * 20"),
    "both": ("'p' * 40 + T + '1' + T + 'q' * 40", "'p' * 40 + T + '2' + T + 'q' * 40"),
    # the strings differ inside the token (an altered copy): what is left of it on either side
    # of the difference, a piece from inside the token, is scrubbed; the copy is no secret
    "inside": ("'p' * 50 + T + 'q' * 50", "'p' * 50 + T[:17] + 'xx' + T[19:] + 'q' * 50"),
}
PREAMBLE = """import os

T = os.environ["PIECES_TOKEN"]
URL = "https://api.example.com/v1/models?access_token=" + T
"""


@pytest.fixture(scope="module")
def introspection(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What pytest prints for each failed `assert left == right` of PAIRS, at the default
    verbosity: its report of the test, from `def` to the next one."""
    folder = tmp_path_factory.mktemp("introspection")
    cases = [
        f"def test_{name}():\n    left, right = {left}, {right}\n    assert left == right\n"
        for name, (left, right) in PAIRS.items()
    ]
    (folder / "test_cut.py").write_text(PREAMBLE + "\n\n" + "\n\n".join(cases))
    printed = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_cut.py"],
        cwd=folder,
        env={**os.environ, "PIECES_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    ).stdout
    reports = re.split(r"\n_{3,} test_(\w+) _{3,}\n", printed)
    return dict(zip(reports[1::2], reports[2::2], strict=True))


def test_an_ellipsis_left_by_saferepr_leaves_no_piece_of_the_token() -> None:
    for before in range(0, 60, 3):
        for after in range(0, 60, 7):
            value = "u" * before + TOKEN + "v" * after
            for maxsize in (20, 31, 40, 64):
                shown = saferepr(value, maxsize=maxsize)
                clean = SCRUBBER.text(shown)[0]
                assert pieces_in(clean, TOKEN, FRAGMENT_MIN) == [], (shown, clean)


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_a_diff_that_skips_identical_characters_leaves_no_piece_of_the_token(
    introspection: dict[str, str], case: str
) -> None:
    shown = introspection[case]
    assert "identical" in shown, shown
    if case in ("both", "inside"):
        assert "identical leading" in shown and "identical trailing" in shown, shown
    assert pieces_in(shown, TOKEN, FRAGMENT_MIN), f"no piece to scrub: {shown}"
    clean, hits = SCRUBBER.text(shown)
    assert hits and pieces_in(clean, TOKEN, FRAGMENT_MIN) == [], clean
    # torchrun's tee prefix, and a record's escaped line breaks, alike
    teed = "\n".join("[default1]:" + line for line in shown.splitlines())
    assert pieces_in(SCRUBBER.text(teed)[0], TOKEN, FRAGMENT_MIN) == []
    escaped = shown.replace("\n", "\\n").encode()
    assert pieces_in(SCRUBBER.data(escaped)[0].decode(), TOKEN, FRAGMENT_MIN) == []


def test_a_stream_written_a_line_at_a_time_leaves_no_piece_of_the_token(
    introspection: dict[str, str],
) -> None:
    """The relay sees the diff's note and its lines in separate writes: it holds the diff until
    it ends (an empty line), then scrubs it whole."""
    for case in ("leading", "both"):
        shown = introspection[case] + "\nnext line\n"
        live = LiveScrub(SCRUBBER)
        written = [live.feed(line) for line in shown.encode().splitlines(keepends=True)]
        out = b"".join([*written, live.end()]).decode()
        assert pieces_in(out, TOKEN, FRAGMENT_MIN) == [] and out.endswith("next line\n"), case
        assert out == SCRUBBER.text(shown)[0], case


def test_a_diff_without_an_end_is_held_no_more_than_its_bound() -> None:
    live = LiveScrub(SCRUBBER)
    live.feed(b"E   Skipping 80 identical leading characters in diff, use -v to show\n")
    written = b"".join(live.feed(b"E   - line %d\n" % i) for i in range(400))
    assert written.count(b"\n") >= 150  # passed on once the bound is reached


@pytest.mark.parametrize(
    "text",
    [
        "Loading... done\u2026 [1/3]",
        "AssertionError: assert 'https://api....ication/json' == 'https://api....n/text'",
        "E   Skipping 78 identical leading characters in diff\nE   - cation/json\nE   + n/text",
        "- a list item\n- another one",
    ],
)
def test_ellipses_and_diffs_without_a_secret_stay_as_they_are(text: str) -> None:
    assert SCRUBBER.text(text) == (text, 0)


def test_a_piece_shorter_than_the_minimum_is_left() -> None:
    """Three characters reveal little, and match ordinary words beside an ellipsis."""
    shown = f"'{TOKEN[:3]}...' and '...{TOKEN[-3:]}'"
    assert SCRUBBER.text(shown) == (shown, 0)


def test_a_long_piece_is_replaced_whole_and_scrubbing_twice_changes_nothing() -> None:
    shown = f"token {TOKEN[:20]}... and ...{TOKEN[-20:]} end"
    clean, hits = SCRUBBER.text(shown)
    assert clean == f"token {SCRUBBED}... and ...{SCRUBBED} end" and hits == 2
    assert SCRUBBER.text(clean) == (clean, 0)
