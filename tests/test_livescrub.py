"""A stream scrubbed as it is written never lets a secret through, however its writes cut it:
split mid-secret, a `NAME=` whose value comes later, a base64 encoding wrapped over lines; what it
holds back stays bounded, and text without a secret comes through unchanged."""

from __future__ import annotations

import base64
import itertools
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core import livescrub
from harness.core.livescrub import LiveScrub
from harness.core.secrets import SCRUBBED, Scrubber

TOKEN = "hf_livescrub0123456789abcdefXYZ"
SCRUBBER = Scrubber.of([TOKEN])


def through(pieces: list[bytes], scrubber: Scrubber = SCRUBBER) -> tuple[list[bytes], bytes]:
    """What a relay writes for each piece, and all it wrote once the stream closed."""
    scrub = LiveScrub(scrubber)
    written = [scrub.feed(piece) for piece in pieces]
    written.append(scrub.end())
    return written, b"".join(written)


def cuts(data: bytes, at: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(at)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def test_a_secret_cut_between_two_writes_is_scrubbed_at_every_cut() -> None:
    line = f"before {TOKEN} after\n".encode()
    for at in range(1, len(line)):
        _, out = through(cuts(line, [at]))
        assert out == f"before {SCRUBBED} after\n".encode(), at


def test_scrubbing_each_write_on_its_own_would_let_a_cut_secret_through() -> None:
    """The control: the bytes the file would hold if each write were scrubbed by itself."""
    line = f"before {TOKEN} after\n".encode()
    naive = b"".join(SCRUBBER.data(piece)[0] for piece in cuts(line, [12]))
    assert TOKEN.encode() in naive


def test_an_unfinished_line_waits_and_a_whole_line_goes_at_once() -> None:
    written, out = through([b"progress ", b"still going", b" done\nnext"])
    assert written[:3] == [b"", b"", b"progress still going done\n"]
    assert written[3] == b"next"  # the stream closed: what was held goes as it is
    assert out == b"progress still going done\nnext"


def test_an_assignment_whose_value_comes_in_a_later_write_is_scrubbed() -> None:
    value = "s3cr3tValueNotInTheEnvironment"
    _, out = through([b"DB_PASSWORD=", value.encode(), b"\n"], Scrubber.of([]))
    assert value.encode() not in out
    assert out == f"DB_PASSWORD={SCRUBBED}\n".encode()


def test_a_wrapped_base64_encoding_is_scrubbed_when_its_lines_come_one_by_one() -> None:
    secret = "a-long-secret-" * 8
    encoded = base64.b64encode(f"user:{secret}".encode()).decode()
    wrapped = "\n".join(textwrap.wrap(encoded, 76)) + "\nend\n"
    pieces = [line.encode() + b"\n" for line in wrapped.splitlines()]
    scrubber = Scrubber.of([secret])
    _, out = through(pieces, scrubber)
    whole = scrubber.data(wrapped.encode())[0]
    assert out == whole and whole != wrapped.encode()


def test_a_secret_that_spans_lines_is_held_until_it_is_whole() -> None:
    key = "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END KEY-----"
    scrubber = Scrubber.of([key])
    pieces = [
        f"key {line}\n".encode() if i == 0 else f"{line}\n".encode()
        for i, line in enumerate(key.splitlines())
    ]
    _, out = through(pieces, scrubber)
    assert b"MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" not in out
    assert SCRUBBED.encode() in out


def test_what_is_held_stays_bounded_on_a_line_without_end() -> None:
    scrub = LiveScrub(SCRUBBER)
    for _ in range(40):
        scrub.feed(b"x " * (16 << 10))
    assert len(scrub.held) <= livescrub.LONGEST_LINE + (32 << 10)


def test_a_run_of_wrapped_base64_is_cut_once_it_passes_its_bound() -> None:
    scrub = LiveScrub(SCRUBBER)
    line = b"A" * 76 + b"\n"
    for _ in range((livescrub.LONGEST_HOLD // len(line)) + 10):
        scrub.feed(line)
    assert len(scrub.held) <= livescrub.LONGEST_HOLD


def test_an_over_long_line_is_never_cut_between_a_name_and_its_value() -> None:
    value = "s3cr3tValueOfAnOverLongLine"
    pieces = [b"x" * (70 << 10) + b" DB_PASSWORD: ", value.encode(), b" tail\n"]
    _, out = through(pieces, Scrubber.of([]))
    assert value.encode() not in out
    assert out.endswith(f" DB_PASSWORD: {SCRUBBED} tail\n".encode())


def test_an_encoding_in_a_long_run_of_wrapped_base64_is_scrubbed_where_it_crosses_64_kib() -> None:
    """A run of wrapped base64 lines is held whole up to its bound (1 MiB), not cut at the
    bound of one line (64 KiB): an encoding of the secret around the 64 KiB mark (at offsets a
    cut there would split it) is found whole."""
    secret = "hf_SECRETVALUE12345abcdefghijklmnopqrstuvwxyz0123456789ABCD"
    scrubber = Scrubber.of([secret])
    filler = bytes(range(256)) * 400
    for before in range(48_380, 48_480, 3):  # the encoding ends up about 64 KiB into the run
        blob = base64.encodebytes(filler[:before] + secret.encode() + filler)
        _, out = through(blob.splitlines(keepends=True), scrubber)
        unwrapped = out.replace(b"\n", b"").decode()
        assert not [form for form in scrubber.forms if form in unwrapped], before
        assert out == scrubber.data(blob)[0] != blob


_TEXT = st.text(alphabet="abc XYZ=:_\n'\"\\", max_size=60)


@settings(max_examples=300, deadline=None)
@given(
    before=_TEXT,
    after=_TEXT,
    form=st.sampled_from([TOKEN, repr(TOKEN), f"HF_TOKEN={TOKEN}", f'"{TOKEN}"']),
    at=st.lists(st.integers(min_value=1, max_value=200), max_size=6),
)
def test_no_cut_of_a_stream_lets_the_secret_through(before, after, form, at) -> None:
    data = f"{before}{form}{after}".encode()
    _, out = through(cuts(data, [a for a in at if a < len(data)]))
    assert TOKEN.encode() not in out


@settings(max_examples=200, deadline=None)
@given(text=_TEXT, at=st.lists(st.integers(min_value=1, max_value=60), max_size=6))
def test_a_stream_without_a_secret_comes_through_unchanged(text, at) -> None:
    data = text.encode()
    _, out = through(cuts(data, [a for a in at if a < len(data)]), Scrubber.of([], shapes=False))
    assert out == data
