"""Secrets out of the evidence: which variables are secrets, every form their values take in
what tools print, and scrubbing that replaces values without breaking the files that hold them.

Why print forms: a test rarely writes a token as-is. pytest's assertion introspection prints
`repr()` (quotes and backslashes escaped), a logger strips a trailing newline, a JSON record
escapes it, a JUnit report XML-escapes it, a shell line quotes it, and these nest (a `repr` inside
a JSON record). A value is also encoded before it is printed: base64 (an HTTP Basic header, a
cookie; either alphabet, padded or not, and at any offset inside a longer encoded string),
percent-encoding (a URL's query) and hex (a byte dump); each encoded form is escaped once more.
Every such form of every secret value is scrubbed, from file contents and from file names.
A base64 encoding wrapped into lines (MIME, the `base64` tool, `base64.encodebytes`: lines of 64
or 76 characters, `\n` or `\r\n`) is looked at with its line breaks removed. A gzip file (a
compressed log or dump a test left) is scrubbed inside, up to GZIP_LIMIT bytes, and compressed
again; a larger one is scrubbed inside a block at a time (`redact.scrub_gzip_stream`).

Why pieces: a printer that cuts a long value short leaves a piece of a secret that no whole form
matches. pytest's introspection shortens each side of a failed comparison around an ellipsis
(`'https://api....H5jC0e&page=1'`) and its diff of two long strings skips their identical
leading or trailing characters (`- jC0e&page=2`). A piece of a form of FRAGMENT_MIN characters or
more is replaced where such a cut shows it: beside an ellipsis, at the edge of a diff's lines. A
value the test derived from a secret (an altered or truncated copy) is no secret: what of it
differs from the secret, and what a cut does not border, is left.

Why shapes too: some text is a credential whatever its value, and whether or not this process's
environment holds it (a rank's own variables, a token given on a command line, a value too short
to scrub wherever it appears). The password of a URL's userinfo (`scheme://user:pass@`), a bare
userinfo that looks issued (`https://ghp_...@host`, not `git@`), and the value of an assignment
to a secret-looking environment name (`HF_TOKEN=...`, `export DB_PASSWORD='...'`,
`'HF_TOKEN': '...'` in a printed dict, a JSON string under such a key) are replaced, the name,
the user and the rest of the URL kept. Names are upper case, as environment variables are:
`max_tokens=8192` is code, not a secret. A number or a switch is no credential
(`MAX_TOKENS=64`, `TOKENIZERS_PARALLELISM=false`), nor a value shorter than 8 characters unless
its name says password or secret: test ids, assertions and config printouts that name such
settings stay evidence a reviewer can read and a rerun can select. Values that are already
placeholders (`[REDACTED]`, `<redacted>`, `****`) are left, so scrubbing twice changes nothing.

Why values, not text: a secret may equal a word the files themselves are made of
(`MY_TOKEN=complete`, a JSON key of the rank record). JSON and XML files are therefore parsed and
only their string values (and the text inside keys, tags' text and attributes) are scrubbed; a
key or a word the schema fixes is never replaced, so the structure survives. A key that is a
secret's form whole is such a word only where it is made of letters and underscores, as the
bundle's keys are: a file a test writes keyed by a credential (an HTTP cache) loses it. XML
comments and processing instructions are kept and scrubbed like text (a PI's target is a name,
like a tag); a document with a DOCTYPE, whose declarations ElementTree does not keep, is
scrubbed as bytes. Other files are scrubbed as bytes.

Secret names are shell-style patterns matched case-insensitively; `DCPQUAL_SECRET_PATTERNS`
(comma-separated) adds to the defaults, it never removes one. Whatever its name, a variable's
value that holds a URL with a password (`scheme://user:password@host`: a DATABASE_URL, a proxy,
a package index) makes that password a secret value. A URL a secret-named variable holds makes
its path a secret value too (with and without its query): a webhook keeps its secret there, and
an HTTP client logs the path apart from the host.
"""

from __future__ import annotations

import base64
import fnmatch
import functools
import gzip
import html
import json
import os
import re
import shlex
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_plus, unquote
from xml.sax.saxutils import escape, quoteattr

PATTERNS_ENV = "DCPQUAL_SECRET_PATTERNS"
DEFAULT_SECRET_PATTERNS: tuple[str, ...] = (
    "*TOKEN*",
    "*SECRET*",
    "*PASSWORD*",
    "*PASSWD*",
    "*PASSPHRASE*",
    "*KEY*",
    "*CREDENTIAL*",
    "*_PAT",
    "*_PASS",
    "*_PASS_*",
    "*_PWD",
    "*_AUTH",
    "*_AUTH_*",
    "*COOKIE*",
    "*SESSION*",
    "*WEBHOOK*",
    "DSN",
    "*_DSN",
    "*_DSN_*",
    "JWT",
    "*_JWT",
    "*_JWT_*",
    "AWS_*",
    "AZURE_*",
    "ARM_CLIENT_*",
    "GOOGLE_*",
    "GCP_*",
    "GCLOUD_*",
    "CLOUDSDK_*",
    "ALIBABA_CLOUD_*",
    "DIGITALOCEAN_*",
    "OCI_*",
)
REDACTED = "<redacted>"
# What replaces a secret found in a file or a name: safe in JSON strings, XML, Markdown, paths.
SCRUBBED = "[REDACTED]"
# Values shorter than this are not scrubbed wherever they appear: replacing "1" or "true"
# everywhere would corrupt the bundle and hide nothing. They are still redacted in `env`, and
# scrubbed where the text names them (`NAME=value`, see the shapes above).
MIN_SCRUB_LENGTH = 8


def secret_patterns(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The default patterns plus the ones `DCPQUAL_SECRET_PATTERNS` adds."""
    environ = os.environ if environ is None else environ
    extra = [p.strip().upper() for p in environ.get(PATTERNS_ENV, "").split(",") if p.strip()]
    return DEFAULT_SECRET_PATTERNS + tuple(p for p in extra if p not in DEFAULT_SECRET_PATTERNS)


def is_secret_name(name: str, patterns: Iterable[str] | None = None) -> bool:
    upper = name.upper()
    chosen = secret_patterns() if patterns is None else patterns
    return any(fnmatch.fnmatchcase(upper, p.upper()) for p in chosen)


# `scheme://user:password@`: the user ends at the first ':', the password at the last '@'
# before the host (as urllib splits a netloc); neither crosses a '/', '?', '#' or whitespace.
_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:([^\s/?#]*)@")


def url_passwords(value: str) -> list[str]:
    """The passwords of the URLs in `value`, as written and percent-decoded."""
    found = []
    for match in _URL_PASSWORD.finditer(value):
        password = match.group(1)
        found += [password, unquote(password)] if password else []
    return found


def without_url_passwords(value: str) -> str:
    """`value` with the password of every URL in it replaced by REDACTED."""
    return _URL_PASSWORD.sub(lambda m: m[0][: m.start(1) - m.start()] + REDACTED + "@", value)


# A URL's path and what follows it (query, fragment), after its scheme and host.
_URL_REST = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#]+(?P<rest>[/?#][^\s]*)")


def url_paths(value: str) -> list[str]:
    """The path of each URL in `value`, with and without its query: where a webhook's URL keeps
    its secret, and what an HTTP client logs apart from the host (urllib3's
    `https://host:443 "POST /services/... HTTP/1.1"`)."""
    found = []
    for match in _URL_REST.finditer(value):
        rest = match["rest"]
        found += [rest, re.split(r"[?#]", rest, maxsplit=1)[0]]
    return found


def secret_values(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Values of every secret-named variable and the paths of the URLs they hold, and passwords
    of URLs in any variable, long enough to scrub safely, longest first."""
    patterns = secret_patterns(environ)
    values = {
        value
        for name, value in environ.items()
        if name != PATTERNS_ENV and is_secret_name(name, patterns)
    }
    values.update(p for value in list(values) for p in url_paths(value))
    values.update(p for value in environ.values() for p in url_passwords(value))
    return tuple(
        sorted(
            (v for v in values if len(v.strip()) >= MIN_SCRUB_LENGTH),
            key=lambda v: (-len(v), v),
        )
    )


_GO_JSON = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})
_TOJSON = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "'": "\\u0027"})


def _escapes(text: str) -> set[str]:
    """The one-level escaped forms of `text` that tools write."""
    forms = {
        text,
        repr(text)[1:-1],
        repr(text.encode("utf-8", "backslashreplace"))[2:-1],
        repr("\"'" + text)[4:-1],  # repr inside a longer string that holds both quotes
        text.replace("\\", "\\\\").replace('"', '\\"'),
        json.dumps(text)[1:-1],
        json.dumps(text, ensure_ascii=False)[1:-1],
        # HTML-safe JSON: Go's encoding/json, Jinja's `tojson` (the apostrophe too)
        json.dumps(text, ensure_ascii=False)[1:-1].translate(_GO_JSON),
        json.dumps(text)[1:-1].translate(_TOJSON),
        escape(text),
        quoteattr(text)[1:-1],
        escape(text, {'"': "&quot;", "'": "&apos;"}),
        escape(text, {'"': "&#34;", "'": "&#39;"}),
        text.replace("&", "&amp;").replace("<", "&lt;"),  # writers that leave '>' alone
        shlex.quote(text),
        shlex.quote(text)[1:-1] if shlex.quote(text).startswith("'") else text,
        html.escape(text),
        ascii(text)[1:-1],
        ascii("\"'" + text)[4:-1],
        text.encode("unicode_escape").decode("ascii"),
    }
    return {f for f in forms if f}


# How HTML and XML writers spell a quote: every named, decimal and hex entity.
_APOSTROPHES = ("'", "&#x27;", "&#X27;", "&#39;", "&#039;", "&apos;")
_QUOTES = ('"', "&quot;", "&#x22;", "&#X22;", "&#34;", "&#034;")


def _entities(text: str) -> set[str]:
    """`text` with '&', '<', '>' escaped and its quotes in every entity spelling (pairs of
    spellings: a writer escapes both quotes alike or one of them only)."""
    if "'" not in text and '"' not in text:
        return {escape(text)}
    return {
        escape(text, {"'": apostrophe, '"': quote_})
        for apostrophe in _APOSTROPHES
        for quote_ in _QUOTES
    }


def _base64_forms(raw: bytes) -> set[str]:
    """`raw` base64-encoded alone (padded or not), and the characters that encode it at each of
    the three offsets it can have inside a longer encoded string (the edge characters mix in
    the bytes around it, so they are left out); in both alphabets."""
    whole = base64.b64encode(raw).decode()
    forms = {whole, whole.rstrip("=")}
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).decode()
        first, end = (8 * shift + 5) // 6, 8 * (shift + len(raw)) // 6
        forms.add(encoded[first:end])
    return forms | {f.replace("+", "-").replace("/", "_") for f in forms}


def _encodings(text: str) -> set[str]:
    """The encoded forms of `text` that tools write: base64, percent-encoding, hex."""
    raw = text.encode("utf-8")
    forms = _base64_forms(raw) | {raw.hex(), raw.hex().upper()}
    quoted = {quote(text), quote(text, safe=""), quote_plus(text), quote_plus(text, safe="/")}
    # %2f is as valid as %2F, and some encoders (and hand-written URLs) write it so
    forms |= quoted | {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), q) for q in quoted}
    return {f for f in forms if f}


def print_forms(value: str) -> tuple[str, ...]:
    """Every form of `value` we scrub: raw and stripped, each escaped or encoded once, and each
    of those escaped once more."""
    bases = {value, value.strip(), value.rstrip("\r\n"), value.strip("\r\n")}
    first: set[str] = set()
    for base in bases:
        if len(base.strip()) >= MIN_SCRUB_LENGTH:
            first |= _escapes(base) | _encodings(base) | _entities(base)
    forms = set(first)
    for form in first:
        forms |= _escapes(form)
    return tuple(sorted(forms, key=lambda f: (-len(f), f)))


_ALNUM_RUN = re.compile(r"[A-Za-z0-9]+")

_B64 = "A-Za-z0-9+/_-"
# A line break after 64 base64 characters (or 63 and a '\r') and before more: where a wrapped
# encoding may cut a secret's. Searched from the '\n', so a text without one costs little.
_WRAP_BREAK = re.compile(rf"\n(?<=[{_B64}]{{63}}[\r{_B64}]\n)(?=[{_B64}])")
# Lines of at least 64 base64 characters, each ending in a line break, then the last line.
_WRAPPED = re.compile(rf"(?<![{_B64}])[{_B64}]{{64,}}\r?\n(?:[{_B64}]{{64,}}\r?\n)*[{_B64}]+")
# The userinfo of a URL: from '://' to the last '@' before the host, as urllib splits it.
_USERINFO = re.compile(r"://(?<=[A-Za-z0-9+.-]://)(?P<userinfo>[^\s/?#\"'`\\<>]+)@")
# An upper-case NAME at a word's start, assigned (`NAME=`) or a quoted key (`'NAME': `), and its
# value: quoted, or up to what ends a word in a shell line, a URL's query or markup.
_WORD_END = r"\s\"'`\\<>&;|,)\]}"
# `NAME=`, `'NAME': ` (a printed dict, JSON) and `NAME: ` (a header, YAML, a log line).
_ASSIGN = r"(?:=|[\"']:[ \t]*|:[ \t]+)"
_VALUE = rf"(?:\"(?P<dq>[^\"\n]*)\"|'(?P<sq>[^'\n]*)'|(?P<bare>[^{_WORD_END}=][^{_WORD_END}]*))"
_ASSIGNED = re.compile(r"(?P<name>[A-Z](?<![A-Za-z0-9_][A-Z])[A-Z0-9_]*)" + _ASSIGN + _VALUE)
# Any case, for names that say password or secret (`password=`, `Password: `, `secret='...'`):
# a program's own settings are spelt so, not only environment variables.
_ASSIGNED_ANY_CASE = re.compile(
    r"(?<![A-Za-z0-9_])(?P<name>[A-Za-z_][A-Za-z0-9_]*)" + _ASSIGN + _VALUE
)
# Where a printer cut a long text short: an ellipsis (pytest's and reprlib's `saferepr`, rich's
# `…`), and the lines of a pytest diff that skipped its strings' identical leading or trailing
# characters. What it left beside the cut may be a piece of a secret's form, no longer whole;
# a piece of at least FRAGMENT_MIN characters is replaced (shorter ones reveal little and would
# match ordinary words).
FRAGMENT_MIN = 4
_ELLIPSIS = re.compile(r"\.{3,}|\u2026")
_DIFF_SKIP = re.compile(r"Skipping \d+ identical (?P<side>leading|trailing) characters in diff")
# A line of a diff after such a note: `- text` or `+ text`, behind torchrun's `[default0]:`,
# pytest's `E` and indentation; and a line that is empty behind them (where the diff ends).
_DIFF_LINE_START = r"(?:\[[^\]\r\n]{0,40}\]:)?[ \t]*(?:E(?![^ \t\r\n]))?[ \t]*"
_DIFF_LINE = re.compile(_DIFF_LINE_START + r"[-+] (?P<body>[^\r\n]*)")
_EMPTY_LINE = re.compile(_DIFF_LINE_START + r"\r?")
DIFF_LINES = 200  # lines looked at after a skip note: a diff of more is cut there
_CREDENTIAL_WORD = re.compile(r"pass(?:word|wd|phrase)?(?![a-z])|pwd|secret", re.IGNORECASE)
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
# What a key of the bundle's own JSON is made of (`negative_control`, torchrun's `errorCode`).
_STRUCTURE_WORD = re.compile(r"[A-Za-z_]+")


def _placeholder(value: str) -> bool:
    """A value some scrubber already replaced (or that names no value): left as it is."""
    return value[:1] in ("[", "<") or not value.strip("*")


# Names whose value is a credential however short (a PIN, a short password); other secret-looking
# names (`*TOKEN*`, `*KEY*`) also name counts and settings (`MAX_TOKENS`, `CACHE_KEY`).
_CREDENTIAL_NAME = re.compile(r"PASS|PWD|SECRET")
# Values that are no credential whatever they are assigned to: switches; and numbers, unless
# the name says password or secret (a PIN).
_SWITCH = re.compile(r"true|false|yes|no|on|off|none|null", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?[0-9][0-9_.]*")
_LETTER, _DIGIT = re.compile(r"[A-Za-z]"), re.compile(r"[0-9]")


def _credential_value(name: str, value: str) -> bool:
    """`value`, assigned to the secret-looking `name`, may be a credential: not a switch, and
    (unless the name says password or secret) no number and long enough to be one. So
    `MAX_TOKENS=64`, `TOKENIZERS_PARALLELISM=false` and `CACHE_KEY=abc123` stay readable (a
    failed assertion on them is evidence); `HF_TOKEN=hf_...`, `DB_PASSWORD=pw1` and
    `SERVICE_PIN_PWD=4711` do not."""
    if _placeholder(value) or _SWITCH.fullmatch(value.strip()):
        return False
    if _CREDENTIAL_NAME.search(name.upper()):
        return True
    return len(value) >= MIN_SCRUB_LENGTH and not _NUMBER.fullmatch(value.strip())


def _credential_userinfo(userinfo: str) -> tuple[int, int] | None:
    """The part of a URL's userinfo that is a credential, as a span within it: the password of
    `user:password`, or a bare user that looks like a token (long, letters and digits: a
    `ghp_...`), never a plain user name (`git@`, `ci@`), which is what a reviewer reads."""
    user, colon, password = userinfo.partition(":")
    if colon:
        start = len(user) + 1
        return None if _placeholder(password) or not password else (start, len(userinfo))
    looks_issued = bool(_LETTER.search(user) and _DIGIT.search(user))
    if len(user) >= MIN_SCRUB_LENGTH and looks_issued and not _placeholder(user):
        return (0, len(userinfo))
    return None


def _scrubbed(length: int) -> str:
    return SCRUBBED


def _replaced(text: str, spans: list[tuple[int, int]], fill: Callable[[int], str]) -> str:
    """`text` with each span replaced by `fill(its length)`; overlapping spans count as one."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    pieces: list[str] = []
    last = 0
    for start, end in merged:
        pieces += [text[last:start], fill(end - start)]
        last = end
    return "".join(pieces) + text[last:]


def _anchors(forms: Iterable[str]) -> tuple[str, ...]:
    """Substrings such that every form holds one: each form's longest alphanumeric run (the
    part its escaped and encoded variants share), dropping any that holds another anchor."""
    found = {max(_ALNUM_RUN.findall(form), key=len, default=form) for form in forms}
    ordered = sorted(found, key=len)
    kept: list[str] = []
    for anchor in ordered:
        if not any(shorter in anchor for shorter in kept):
            kept.append(anchor)
    return tuple(kept)


@dataclass(frozen=True)
class Scrubber:
    """Replaces every print form of a set of secret values and, with `shapes`, what is a
    credential by its shape (a URL's userinfo, the value of a NAME=value whose NAME matches
    `patterns`); `bool(s)` is False where it can replace nothing.

    A text holding none of the anchors holds no form, so it is passed over after a few
    searches instead of one per form (most strings of a bundle hold no secret)."""

    forms: tuple[str, ...]
    shapes: bool = True
    patterns: tuple[str, ...] = DEFAULT_SECRET_PATTERNS
    anchors: tuple[str, ...] = field(init=False, repr=False, compare=False)
    byte_anchors: tuple[bytes, ...] = field(init=False, repr=False, compare=False)
    secret_names: re.Pattern[str] = field(init=False, repr=False, compare=False)
    seen_names: dict[str, bool] = field(init=False, repr=False, compare=False)
    pieces: _Pieces = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pieces", _Pieces.of(self.forms))
        anchors = _anchors(self.forms)
        object.__setattr__(self, "anchors", anchors)
        object.__setattr__(self, "byte_anchors", tuple(a.encode("utf-8") for a in anchors))
        names = "|".join(fnmatch.translate(p.upper()) for p in self.patterns) or "(?!)"
        object.__setattr__(self, "secret_names", re.compile(names))
        object.__setattr__(self, "seen_names", {})  # a log assigns the same few names again

    @classmethod
    def of(
        cls,
        secrets: Iterable[str],
        *,
        shapes: bool = True,
        patterns: tuple[str, ...] = DEFAULT_SECRET_PATTERNS,
    ) -> Scrubber:
        forms = {f for s in secrets for f in print_forms(s)}
        return cls(tuple(sorted(forms, key=lambda f: (-len(f), f))), shapes, patterns)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Scrubber:
        environ = os.environ if environ is None else environ
        return cls.of(secret_values(environ), patterns=secret_patterns(environ))

    def __bool__(self) -> bool:
        return bool(self.forms) or self.shapes

    def text(self, text: str) -> tuple[str, int]:
        """`text` with every form and shape replaced by SCRUBBED, and how many were replaced."""
        count = 0
        if any(anchor in text for anchor in self.anchors):
            for form in self.forms:
                hits = text.count(form)
                if hits:
                    text = text.replace(form, SCRUBBED)
                    count += hits
        if self._may_hold_more(text):
            text, more = self._beyond_forms(text, _scrubbed)
            count += more
        return text, count

    def data(self, data: bytes) -> tuple[bytes, int]:
        count = 0
        if any(anchor in data for anchor in self.byte_anchors):
            for form in self.forms:
                raw = form.encode("utf-8")
                hits = data.count(raw)
                if hits:
                    data = data.replace(raw, SCRUBBED.encode())
                    count += hits
        data, more = self._beyond_forms_data(data, _scrubbed)
        return data, count + more

    def _beyond_forms(self, text: str, fill: Callable[[int], str]) -> tuple[str, int]:
        """`text` with the forms a line-wrapped encoding cut and every shape replaced by
        `fill(length)`, and how many were; after the forms themselves are replaced."""
        spans: list[tuple[int, int]] = []
        if self.forms and "\n" in text and _WRAP_BREAK.search(text):
            for block in _WRAPPED.finditer(text):
                spans += [(block.start() + a, block.start() + b) for a, b in self._cut(block[0])]
        if self.forms and _may_be_cut(text):
            spans += self.pieces.spans(text)
        if self.shapes:
            spans += self._shape_spans(text)
        return (_replaced(text, spans, fill), len(spans)) if spans else (text, 0)

    def _may_hold_more(self, text: str) -> bool:
        """False for a text `_beyond_forms` would leave as it is, after a few searches (most
        strings of a bundle: a test's id, a tag's text)."""
        return (bool(self.forms) and ("\n" in text or _may_be_cut(text))) or (
            self.shapes
            and ("=" in text or "://" in text or "':" in text or '":' in text or ": " in text)
        )

    def _beyond_forms_data(self, data: bytes, fill: Callable[[int], str]) -> tuple[bytes, int]:
        """`_beyond_forms` on bytes, decoded so that every byte comes back as it was."""
        may_be_cut = b"\n" in data or b"..." in data or b"\xe2\x80\xa6" in data
        if not (self.shapes or (self.forms and may_be_cut)):
            return data, 0
        text, hits = self._beyond_forms(data.decode("utf-8", "surrogateescape"), fill)
        return (text.encode("utf-8", "surrogateescape"), hits) if hits else (data, 0)

    def _cut(self, block: str) -> list[tuple[int, int]]:
        """Spans of `block` (lines of base64) that are forms once its line breaks are removed."""
        at = [i for i, char in enumerate(block) if char not in "\r\n"]
        joined = "".join(block[i] for i in at)
        if not any(anchor in joined for anchor in self.anchors):
            return []
        spans = []
        for form in self.forms:
            start = joined.find(form)
            while start != -1:
                end = start + len(form)
                spans.append((at[start], at[end - 1] + 1))
                joined = joined[:start] + "\0" * len(form) + joined[end:]  # found once
                start = joined.find(form, end)
        return spans

    def secret_name(self, name: str) -> bool:
        """Whether `name` is an environment-style name (upper case) that names a secret."""
        known = self.seen_names.get(name)
        if known is None:
            known = self.seen_names[name] = (
                bool(_ENV_NAME.fullmatch(name))
                and name != PATTERNS_ENV
                and bool(self.secret_names.match(name))
            )
        return known

    def _shape_spans(self, text: str) -> list[tuple[int, int]]:
        """Spans of the userinfo of every URL and of the value of every secret-named
        assignment in `text`, placeholders left out."""
        found = []
        if "://" in text:
            for m in _USERINFO.finditer(text):
                part = _credential_userinfo(m["userinfo"])
                if part is not None:
                    found.append((m.start("userinfo") + part[0], m.start("userinfo") + part[1]))
        for m in _ASSIGNED.finditer(text):
            if self.secret_name(m["name"]):
                group = next(g for g in ("dq", "sq", "bare") if m[g] is not None)
                if _credential_value(m["name"], m[group]):
                    found.append(m.span(group))
        for m in _ASSIGNED_ANY_CASE.finditer(text):
            name = m["name"]
            if name.isupper() or not _CREDENTIAL_WORD.search(name):
                continue  # upper case: an environment name, judged above
            group = next(g for g in ("dq", "sq", "bare") if m[g] is not None)
            value = m[group]
            if not (_placeholder(value) or _SWITCH.fullmatch(value) or _NUMBER.fullmatch(value)):
                found.append(m.span(group))
        return [(a, b) for a, b in found if b > a and not _placeholder(text[a:b])]

    def value(self, value: Any) -> tuple[Any, int]:
        """A JSON value with its strings scrubbed. A key is scrubbed inside, but a key that is
        exactly a secret form and a word (letters and underscores) is a word of the structure and
        is left as it is. A string under a secret-named key (`{"HF_TOKEN": ...}`) is replaced
        whole."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            items = [self.value(v) for v in value]
            return [v for v, _ in items], sum(n for _, n in items)
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            count = 0
            for key, item in value.items():
                word = key in self.forms and _STRUCTURE_WORD.fullmatch(key)
                new_key, hits = (key, 0) if word else self.text(key)
                new_item, more = self.value(item)
                if self._secret_key(key, new_item):
                    new_item, more = SCRUBBED, more + 1
                while new_key in out:
                    new_key += "~"
                out[new_key] = new_item
                count += hits + more
            return out, count
        return value, 0

    def _secret_key(self, key: str, item: Any) -> bool:
        """A string (not a placeholder) under a secret-named key: `{"HF_TOKEN": "..."}`."""
        return (
            self.shapes
            and isinstance(item, str)
            and bool(item)
            and self.secret_name(key)
            and _credential_value(key, item)
        )

    def json_bytes(self, data: bytes) -> tuple[bytes, int]:
        """A JSON document scrubbed as values; bytes that are not JSON are scrubbed as text."""
        try:
            parsed = json.loads(data)
        except (ValueError, RecursionError):
            return self.data(data)
        clean, hits = self.value(parsed)
        if not hits:
            return data, 0
        return (json.dumps(clean, indent=2, sort_keys=True) + "\n").encode(), hits

    def xml_bytes(self, data: bytes) -> tuple[bytes, int]:
        """An XML document scrubbed in its text, attribute values, comments and processing
        instructions, never in tag names or a PI's target."""
        document = _Document()
        try:
            parser = ET.XMLParser(target=document)
            parser.feed(data)
            root = parser.close()
        except (ET.ParseError, ValueError):
            return self.data(data)
        if document.has_doctype:  # its declarations would be lost: scrubbed where they are
            return self.data(data)
        count = 0
        for element in document.nodes(root):
            tag: object = element.tag  # a PI's tag is its factory, not a name
            if tag is ET.ProcessingInstruction and element.text:
                target, space, rest = element.text.partition(" ")
                new, hits = self.text(rest)
                element.text = target + space + new
                count += hits
            elif element.text:
                element.text, hits = self.text(element.text)
                count += hits
            if element.tail:
                element.tail, hits = self.text(element.tail)
                count += hits
            for key, item in list(element.attrib.items()):
                element.attrib[key], hits = self.text(item)
                count += hits
        if not count:
            return data, 0
        return document.serialize(root), count

    def file_bytes(self, name: str, data: bytes) -> tuple[bytes, int]:
        if data[:2] == GZIP_MAGIC and (inner := gunzipped(data)) is not None:
            # a compressed log or dump: its secrets are not in its bytes as written
            clean, hits = self.file_bytes(name.removesuffix(".gz"), inner)
            if hits:
                return gzip.compress(clean, mtime=0), hits
        if name.endswith(".json"):
            return self.json_bytes(data)
        if name.endswith(".xml"):
            return self.xml_bytes(data)
        return self.data(data)

    def name(self, relpath: str) -> str:
        """A relative path with every secret form removed from its components."""
        parts = [self.text(part)[0] for part in relpath.split("/")]
        return "/".join(p if p not in ("", ".", "..") else SCRUBBED for p in parts)


def _may_be_cut(text: str) -> bool:
    """Whether `text` may show a cut (see `_ELLIPSIS`, `_DIFF_SKIP`), after a few searches."""
    return "..." in text or "\u2026" in text or "identical" in text


@dataclass(frozen=True)
class _Pieces:
    """The pieces of secret forms that a cut leaves: each form's prefixes (what is left before an
    ellipsis) and suffixes (what is left after one), of FRAGMENT_MIN characters up to the whole
    form; and at the edge of a pytest diff's line that skipped identical characters, any piece of
    a form (`holding`: where the strings differ inside the secret, the piece is from its middle).

    Each piece is filed under its last (a prefix) or first (a suffix) FRAGMENT_MIN characters
    with its length, so a cut is checked only for the lengths a piece that ends (or starts)
    there can have: a text's ordinary ellipses cost a lookup each."""

    prefixes: frozenset[str]
    suffixes: frozenset[str]
    prefix_sizes: Mapping[str, tuple[int, ...]]
    suffix_sizes: Mapping[str, tuple[int, ...]]
    holding: Mapping[str, tuple[str, ...]]  # each FRAGMENT_MIN characters: the forms holding them

    @classmethod
    def of(cls, forms: Iterable[str]) -> _Pieces:
        prefixes: set[str] = set()
        suffixes: set[str] = set()
        prefix_sizes: dict[str, set[int]] = {}
        suffix_sizes: dict[str, set[int]] = {}
        holding: dict[str, set[str]] = {}
        for form in forms:
            for at in range(len(form) - FRAGMENT_MIN + 1):
                holding.setdefault(form[at : at + FRAGMENT_MIN], set()).add(form)
            for size in range(FRAGMENT_MIN, len(form)):
                head, tail = form[:size], form[-size:]
                prefixes.add(head)
                suffixes.add(tail)
                prefix_sizes.setdefault(head[-FRAGMENT_MIN:], set()).add(size)
                suffix_sizes.setdefault(tail[:FRAGMENT_MIN], set()).add(size)
        return cls(
            frozenset(prefixes),
            frozenset(suffixes),
            {gram: tuple(sorted(sizes)) for gram, sizes in prefix_sizes.items()},
            {gram: tuple(sorted(sizes)) for gram, sizes in suffix_sizes.items()},
            {gram: tuple(held) for gram, held in holding.items()},
        )

    def ending_at(self, text: str, end: int) -> tuple[int, int] | None:
        """The longest prefix of a form that `text` holds just before `end`, as a span."""
        sizes = self.prefix_sizes.get(text[max(0, end - FRAGMENT_MIN) : end], ())
        for size in reversed(sizes):
            if size <= end and text[end - size : end] in self.prefixes:
                return (end - size, end)
        return None

    def starting_at(self, text: str, start: int) -> tuple[int, int] | None:
        """The longest suffix of a form that `text` holds just from `start`, as a span."""
        sizes = self.suffix_sizes.get(text[start : start + FRAGMENT_MIN], ())
        for size in reversed(sizes):
            if start + size <= len(text) and text[start : start + size] in self.suffixes:
                return (start, start + size)
        return None

    def held_from(self, text: str, start: int, end: int) -> tuple[int, int] | None:
        """The longest start of `text[start:end]` that some form holds anywhere, as a span: the
        start of a diff line after skipped leading characters is a piece from inside the form
        where the strings differ inside the secret (a truncated or altered copy of it)."""
        forms = self.holding.get(text[start : start + FRAGMENT_MIN], ())
        size = FRAGMENT_MIN if forms else 0
        while start + size < end and any(text[start : start + size + 1] in f for f in forms):
            size += 1  # a longer piece holds the shorter: the first miss ends the search
        return (start, start + size) if size else None

    def held_to(self, text: str, start: int, end: int) -> tuple[int, int] | None:
        """The longest end of `text[start:end]` that some form holds anywhere, as a span."""
        forms = self.holding.get(text[max(start, end - FRAGMENT_MIN) : end], ())
        size = FRAGMENT_MIN if forms and end - start >= FRAGMENT_MIN else 0
        while end - size > start and any(text[end - size - 1 : end] in f for f in forms):
            size += 1
        return (end - size, end) if size else None

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Spans of the pieces of forms that `text` shows beside a cut."""
        if not self.prefixes:
            return []
        found: list[tuple[int, int] | None] = []
        for m in _ELLIPSIS.finditer(text):
            # `api....x`: the cut's three dots may follow a dot of the text, or precede one
            found += [self.ending_at(text, m.start()), self.ending_at(text, m.end() - 3)]
            found += [self.starting_at(text, m.end()), self.starting_at(text, m.start() + 3)]
        for m in _DIFF_SKIP.finditer(text):
            leading = m["side"] == "leading"
            for line in _diff_lines(text, m.end()):
                start, end = line.span("body")
                found.append(
                    self.held_from(text, start, end) if leading else self.held_to(text, start, end)
                )
        return sorted({span for span in found if span is not None})


def diff_open(text: str) -> bool:
    """Whether `text`, whose first line is a diff's skip note, may not hold the whole diff yet:
    no empty line ends it and it has fewer than DIFF_LINES lines after the note."""
    note = _DIFF_SKIP.match(text, text.find("Skipping") if "Skipping" in text else len(text))
    if note is None:
        return False
    lines = text[note.end() :].split("\n")[1:]
    if lines and lines[-1] == "":
        lines.pop()  # the text ends with a line break: no line begun after it
    return len(lines) < DIFF_LINES and not any(_EMPTY_LINE.fullmatch(line) for line in lines)


# A line break, or one escaped in a JSON string or a `repr` a log line holds.
_LINE_BREAK = re.compile(r"\r?\n|(?:\\r)?\\n")


def _diff_lines(text: str, after: int) -> Iterator[re.Match[str]]:
    """The `- `/`+ ` lines of the diff that follows a skip note ending at `after`: of the next
    DIFF_LINES lines, those before the first empty one."""
    breaks = _LINE_BREAK.finditer(text, after)
    previous = next(breaks, None)
    for _ in range(DIFF_LINES):
        if previous is None:
            return
        following = next(breaks, None)
        start, end = previous.end(), len(text) if following is None else following.start()
        if _EMPTY_LINE.fullmatch(text, start, end):
            return
        match = _DIFF_LINE.match(text, start, end)
        if match is not None:
            yield match
        previous = following


GZIP_MAGIC = b"\x1f\x8b"
GZIP_LIMIT = 256 << 20  # what a gzip file may hold, decompressed, to be scrubbed inside


def gunzipped(data: bytes) -> bytes | None:
    """What gzip `data` holds (every member), or None where it is not whole gzip or holds more
    than GZIP_LIMIT bytes."""
    out = bytearray()
    try:
        while data:
            member = zlib.decompressobj(wbits=31)
            out += member.decompress(data, GZIP_LIMIT + 1 - len(out))
            if len(out) > GZIP_LIMIT or member.unconsumed_tail or not member.eof:
                return None
            data = member.unused_data
    except zlib.error:
        return None
    return bytes(out)


@dataclass
class _Document:
    """ElementTree's tree builder, keeping what `ET.fromstring` drops: comments and processing
    instructions, inside the root and around it; and whether the document has a DOCTYPE."""

    builder: ET.TreeBuilder = field(
        default_factory=lambda: ET.TreeBuilder(insert_comments=True, insert_pis=True)
    )
    depth: int = 0
    seen_root: bool = False
    before: list[ET.Element] = field(default_factory=list)
    after: list[ET.Element] = field(default_factory=list)
    has_doctype: bool = False

    def start(self, tag: str, attrs: dict[str, str]) -> ET.Element:
        self.depth += 1
        self.seen_root = True
        return self.builder.start(tag, attrs)

    def end(self, tag: str) -> ET.Element:
        self.depth -= 1
        return self.builder.end(tag)

    def data(self, data: str) -> None:
        self.builder.data(data)

    def comment(self, text: str) -> ET.Element:
        return self._outside(self.builder.comment(text))

    def pi(self, target: str, text: str | None = None) -> ET.Element:
        return self._outside(self.builder.pi(target, text))

    def doctype(self, name: str, pubid: str | None, system: str | None) -> None:
        self.has_doctype = True

    def close(self) -> ET.Element:
        return self.builder.close()

    def _outside(self, node: ET.Element) -> ET.Element:
        if not self.depth:  # the builder only inserts what is inside the root
            (self.after if self.seen_root else self.before).append(node)
        return node

    def nodes(self, root: ET.Element) -> Iterator[ET.Element]:
        yield from self.before
        yield from root.iter()
        yield from self.after

    def serialize(self, root: ET.Element) -> bytes:
        nodes = [*self.before, root, *self.after]
        body = b"\n".join(ET.tostring(node, encoding="utf-8") for node in nodes)
        return b"<?xml version='1.0' encoding='utf-8'?>\n" + body


# Tokens as their issuers shape them (Hugging Face, GitHub, GitLab, Slack, OpenAI-style keys,
# AWS access key ids, npm, PyPI): a credential wherever it is typed, whatever names it.
_ISSUED_TOKEN = re.compile(
    r"(?<![A-Za-z0-9])(?:(?:hf|ghp|gho|ghu|ghs|ghr|github_pat|npm)_[A-Za-z0-9_]{16,}"
    r"|glpat-[A-Za-z0-9_-]{16,}|xox[abposr]-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{16,}"
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}|pypi-[A-Za-z0-9_-]{16,})"
)
_typed: list[str] = []  # secrets typed on this process's own command line


def command_line_secrets(argv: Sequence[str]) -> tuple[str, ...]:
    """Secrets typed on a command line: the value of an option whose name is a secret name
    (`--token X`, `--api-key=X`, `HF_TOKEN=X`) and anything shaped like an issued token."""
    found: list[str] = []
    previous_secret = False
    for arg in argv:
        if previous_secret and not arg.startswith("-"):
            found.append(arg)
        previous_secret = False
        name, eq, value = arg.lstrip("-").partition("=")
        named = is_secret_name(name.replace("-", "_")) and bool(_ENV_NAME_ANY.fullmatch(name))
        if named and eq:
            found.append(value)
        elif named and arg.startswith("-"):
            previous_secret = True
        found += _ISSUED_TOKEN.findall(arg)
    return tuple(
        dict.fromkeys(
            v
            for v in found
            if len(v.strip()) >= MIN_SCRUB_LENGTH
            and not (_NUMBER.fullmatch(v.strip()) or _SWITCH.fullmatch(v.strip()))
        )
    )


_ENV_NAME_ANY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def typed_secrets() -> list[str]:
    """The secrets registered from this process's command line (`register_command_line`)."""
    return list(_typed)


def register_secrets(values: Sequence[str]) -> None:
    """Scrub `values` as secrets typed on the command line (a process that scrubs for another,
    which sent it what its own command line held)."""
    _typed[:] = [v for v in values if len(v.strip()) >= MIN_SCRUB_LENGTH]


def register_command_line(argv: Sequence[str], file_names: Collection[str] = ()) -> None:
    """Scrub what this process's own command line typed as secrets (see
    `command_line_secrets`) wherever the environment's secrets are scrubbed, less the values
    its parser took as file names (`--key FILE` names a key, it is not one)."""
    _typed[:] = [v for v in command_line_secrets(argv) if v not in file_names]


def environment_scrubber() -> Scrubber:
    """The Scrubber of every print form of the secret values in this process's environment
    (the ranks inherit it) and on its own command line, and of the shapes of credentials:
    what the bundle, the launcher's console and the CLI's error line are scrubbed with. Built
    once per set of values, as the console asks for it at every line."""
    values = tuple(dict.fromkeys((*secret_values(os.environ), *_typed)))
    return _scrubber_of(values, secret_patterns(os.environ))


@functools.lru_cache(maxsize=4)
def _scrubber_of(values: tuple[str, ...], patterns: tuple[str, ...]) -> Scrubber:
    return Scrubber.of(values, patterns=patterns)
