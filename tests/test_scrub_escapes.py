"""Every escaped form the standard library prints a secret as, and the shapes of credentials
a test prints by name, are scrubbed (the oracles are the standard library's own functions, not
the scrubber's list of forms)."""

from __future__ import annotations

import html
import json
import string
from collections.abc import Callable
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core.secrets import SCRUBBED, Scrubber, command_line_secrets

# A secret with both quotes, an ampersand, a backslash, a '<' and non-ASCII letters: every
# escaping function below changes it.
NASTY = "hf_Ab'c\"d&e<f>g\\h-töken-ÄÖ-🔑-xyz"

PRINTERS: dict[str, Callable[[str], str]] = {
    "html.escape": html.escape,
    "html.escape-noquote": lambda s: html.escape(s, quote=False),
    "html-&#x27;-upper": lambda s: html.escape(s).replace("&#x27;", "&#X27;"),
    "html-&#039;": lambda s: html.escape(s).replace("&#x27;", "&#039;"),
    "html-&#39;-&#34;": lambda s: (
        html.escape(s).replace("&#x27;", "&#39;").replace("&quot;", "&#34;")
    ),
    "html-&apos;-&#x22;": lambda s: (
        html.escape(s).replace("&#x27;", "&apos;").replace("&quot;", "&#x22;")
    ),
    "ascii": lambda s: ascii(s),
    "unicode_escape": lambda s: s.encode("unicode_escape").decode("ascii"),
    "repr": repr,
    "repr-bytes": lambda s: repr(s.encode()),
    "json": json.dumps,
    "json-no-ascii": lambda s: json.dumps(s, ensure_ascii=False),
    "quote": lambda s: quote(s, safe=""),
    "quote_plus": quote_plus,
    # HTML-safe JSON: Go's encoding/json (raw non-ASCII) and Jinja's `tojson` (also the apostrophe)
    "json-go": lambda s: _html_safe(json.dumps(s, ensure_ascii=False), "<>&"),
    "json-tojson": lambda s: _html_safe(json.dumps(s), "<>&'"),
}


def _html_safe(text: str, chars: str) -> str:
    """`text` with each of `chars` written as a JSON `\\u00XX` escape."""
    return "".join(f"\\u{ord(c):04x}" if c in chars else c for c in text)


@pytest.mark.parametrize("printer", PRINTERS, ids=list(PRINTERS))
def test_every_printed_form_of_a_secret_is_scrubbed(printer: str) -> None:
    printed = PRINTERS[printer](NASTY)
    assert printed != NASTY or printer == "json-no-ascii"
    text, hits = Scrubber.of([NASTY]).text(f"before {printed} after")
    assert hits >= 1 and SCRUBBED in text
    assert "töken" not in text and "t\\xf6ken" not in text and "xyz" not in text, text


@settings(max_examples=40, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(string.ascii_letters + "'\"&<>\\äöü€🔑 "), min_size=10).filter(
        lambda s: len(s.strip()) >= 8
    )
)
def test_html_and_ascii_forms_of_any_secret_are_scrubbed(secret: str) -> None:
    scrubber = Scrubber.of([secret])
    for printed in (html.escape(secret), ascii(secret)[1:-1], secret.encode("unicode_escape")):
        shown = printed if isinstance(printed, str) else printed.decode("ascii")
        assert scrubber.text(f"<{shown}>")[0].count(SCRUBBED) >= 1, shown


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        ("HF_TOKEN: hf_abcdefgh12345", "HF_TOKEN: "),
        ("Authorization header AWS_SECRET_ACCESS_KEY:  wJalrXUtnFEMIK7MDENG", "KEY:  "),
        ("password=hunter2hunter2", "password="),
        ("db_password=pw1", "db_password="),
        ("Password: s3cr3t-value", "Password: "),
        ("connect(secret='abc12345xyz')", "secret='"),
    ],
)
def test_a_credential_by_its_name_is_scrubbed_whatever_the_case_or_separator(
    line: str, kept: str
) -> None:
    text, hits = Scrubber.of([]).text(line)
    assert hits == 1 and kept in text and SCRUBBED in text, text


@pytest.mark.parametrize(
    "line",
    [
        "max_tokens=8192",
        "password=true",
        "ERROR: something failed",
        "HF_TOKEN: [REDACTED]",
        "secret_count: 3",
        "RESULT: ok",
    ],
)
def test_what_is_no_credential_stays_readable(line: str) -> None:
    """Negative controls: settings, switches, counts and placeholders are evidence."""
    assert Scrubber.of([]).text(line) == (line, 0)


@pytest.mark.parametrize(
    ("argv", "secret"),
    [
        (["run", "--", "-k", "not hf_abcdefghijklmnop1234"], "hf_abcdefghijklmnop1234"),
        (["run", "--", "--api-token", "Zq8wLk2pXv9r"], "Zq8wLk2pXv9r"),
        (["run", "--", "--db-password=pw-1234-5678"], "pw-1234-5678"),
        (["run", "--", "MY_SECRET=Zq8wLk2pXv9r"], "Zq8wLk2pXv9r"),
        (["run", "--", "ghp_0123456789abcdefABCDEF"], "ghp_0123456789abcdefABCDEF"),
    ],
)
def test_a_secret_typed_on_the_command_line_is_a_secret(argv: list[str], secret: str) -> None:
    assert secret in command_line_secrets(argv)


def test_ordinary_arguments_are_no_secrets() -> None:
    """Negative control: paths, options, node ids and -k words stay as they are."""
    argv = [
        "run",
        "--nproc-per-node",
        "2",
        "--out",
        "/tmp/out",
        "--",
        "-k",
        "kimi_tokens",
        "suites/capture/test_capture.py::test_x[max_tokens-8]",
        "--max-tokens",
        "64",
    ]
    assert command_line_secrets(argv) == ()
