"""Redaction matches what tools print: for any secret value, each way a tool writes it is gone
after scrubbing, judged by decoding the output the way a reader would (json, ElementTree,
shlex, Python's own string literal parser), not by re-deriving the escaped forms.

And scrubbing never breaks structure: a secret equal to a word the files are made of leaves
the JSON, XML and the receipt valid.
"""

from __future__ import annotations

import ast
import base64
import binascii
import json
import logging
import os
import re
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import quote, quote_plus, unquote, unquote_plus

import pytest
from _support.locked import hold_to_modes, lock, refuse_chmod, unlock_all
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harness.core.secrets import (
    DEFAULT_SECRET_PATTERNS,
    MIN_SCRUB_LENGTH,
    PATTERNS_ENV,
    SCRUBBED,
    Scrubber,
    is_secret_name,
    secret_values,
)
from harness.evidence.redact import ScrubFailed, scrub_folder

# ASCII (Python's literal parser and shlex treat it the same everywhere), with the characters
# that escaping is about over-represented.
_CHARS = st.one_of(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.sampled_from(list("\\'\"&<>\t $`;")),
)
SECRETS = (
    st.text(_CHARS, min_size=8, max_size=40)
    .map(lambda s: s + "\n" if s.endswith("x") else s)  # some carry a trailing newline
    .filter(lambda s: len(s.strip()) >= 8)
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def core(secret: str) -> str:
    """What must not survive: the value without surrounding whitespace."""
    return secret.strip()


def strings_in(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings_in(v)]]
    return []


def usable(secret: str) -> None:
    """A secret that is part of the fixed text around it cannot be told apart from it."""
    assume(core(secret) not in SCRUBBED and SCRUBBED not in secret)
    assume(all(core(secret) not in t for t in ("request refused: ", "token ", " in ", "x'\" ")))


@SETTINGS
@given(SECRETS)
def test_a_json_record_holding_the_secret_keeps_no_copy(secret: str) -> None:
    usable(secret)
    doc = {"message": f"request refused: {secret}", "repr": repr(f"x'\" {secret}"), "n": 1}
    clean, hits = Scrubber.of([secret]).json_bytes(json.dumps(doc).encode())
    assert hits >= 1
    parsed = json.loads(clean)
    assert set(parsed) == {"message", "repr", "n"} and parsed["n"] == 1
    assert not any(core(secret) in s for s in strings_in(parsed))
    assert not any(core(secret) in ast.literal_eval(s) for s in [parsed["repr"]])


@SETTINGS
@given(SECRETS)
def test_a_junit_report_holding_the_secret_keeps_no_copy(secret: str) -> None:
    usable(secret)
    root = ET.Element("testsuite", name="suite")
    case = ET.SubElement(root, "testcase", name=f"test_x[{secret}]", classname="c")
    failure = ET.SubElement(case, "failure", message=f"token {secret}")
    failure.text = f"assert {secret!r} == 'x'\n{secret.strip()}"
    clean, _ = Scrubber.of([secret]).xml_bytes(ET.tostring(root, encoding="utf-8"))
    parsed = ET.fromstring(clean)
    assert parsed.tag == "testsuite" and parsed.find("testcase/failure") is not None
    for element in parsed.iter():
        for text in [element.text or "", *element.attrib.values()]:
            assert core(secret) not in text
    literal = (parsed.find("testcase/failure").text or "").split("\n")[0]
    assert core(secret) not in literal.removeprefix("assert ").removesuffix(" == 'x'")


@SETTINGS
@given(SECRETS)
def test_a_log_line_holding_the_secret_in_any_print_form_keeps_no_copy(secret: str) -> None:
    usable(secret)
    lines = [
        f"HF_TOKEN={secret}",  # raw (a trailing newline included)
        f"token {secret.strip()} in use",  # stripped, as a logger prints it
        f"E   AssertionError: {secret!r}",  # assertion introspection
        f"E   AssertionError: {chr(39) + chr(34) + secret!r}",  # repr forced to '...'
        f"+ curl -H {shlex.quote(secret)}",  # a shell trace
        json.dumps({"t": secret}),
        json.dumps({"t": repr(secret)}),  # repr inside JSON
    ]
    text = "\n".join(lines)
    clean, hits = Scrubber.of([secret]).text(text)
    assert hits >= len(lines) - 1
    assert core(secret) not in clean
    literal = clean.split("\n")[2].removeprefix("E   AssertionError: ")
    if literal.startswith(("'", '"')) and literal.endswith(("'", '"')):
        assert core(secret) not in ast.literal_eval(literal)


@SETTINGS
@given(SECRETS)
def test_a_shell_command_holding_the_secret_keeps_no_copy(secret: str) -> None:
    usable(secret)
    clean, _ = Scrubber.of([secret]).text(f"curl -H {shlex.quote(secret)} https://x")
    assert not any(core(secret) in token for token in shlex.split(clean))


@SETTINGS
@given(st.sampled_from(["complete", "testcase", "failures", "signatures", "negative_control"]))
def test_a_secret_equal_to_a_word_of_the_structure_leaves_it_intact(word: str) -> None:
    scrub = Scrubber.of([word])
    doc = {word: [word, f"x {word} y"], "other": {"name": word, "n": 3}}
    clean, _ = scrub.json_bytes(json.dumps(doc).encode())
    parsed = json.loads(clean)
    assert set(parsed) == {word, "other"} and parsed["other"]["n"] == 3  # keys are structure
    assert parsed[word] == [SCRUBBED, f"x {SCRUBBED} y"] and parsed["other"]["name"] == SCRUBBED
    xml = f'<testsuite><testcase name="{word}">{word}</testcase></testsuite>'.encode()
    tree = ET.fromstring(scrub.xml_bytes(xml)[0])
    assert [e.tag for e in tree.iter()] == ["testsuite", "testcase"]
    assert tree[0].get("name") == SCRUBBED and tree[0].text == SCRUBBED


def test_a_key_that_is_the_secret_itself_is_replaced_unless_it_is_a_word() -> None:
    """A cache a test writes keyed by the credential it fetched with (`{token: {...}}`) holds the
    token as a key: replaced like a value. A key made only of letters and underscores is kept
    (the bundle's own keys are such words, `MY_TOKEN=complete` must not break a record)."""
    token = "hf_Zq8PbX2mK7vN4rT9wY3sL6dF1gH5jC0e"
    scrub = Scrubber.of([token, "negative_control"])
    doc = {token: {"user": "alice"}, "negative_control": 1, "errorCode": 2}
    clean, hits = scrub.json_bytes(json.dumps(doc).encode())
    parsed = json.loads(clean)
    assert hits == 1 and token not in clean.decode()
    assert parsed == {SCRUBBED: {"user": "alice"}, "negative_control": 1, "errorCode": 2}


def test_the_path_of_a_secret_url_is_a_secret_where_a_client_logs_it_alone() -> None:
    """A webhook's URL keeps its secret in the path, and an HTTP client logs the path apart from
    the host (urllib3: `https://hooks.slack.com:443 "POST /services/... HTTP/1.1" 404`)."""
    hook = "https://hooks.slack.com/services/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"
    env = {"SLACK_WEBHOOK_URL": hook + "?thread=1", "HOME": "/home/someone/with/a/long/path"}
    values = secret_values(env)
    assert "/services/T04ABCD1234/B05EFGH5678/q9Wv3XyZ7tLmN2pR8sK4dF6h" in values
    assert "/home/someone/with/a/long/path" not in values  # only secret-named variables
    path = "/services/T04ABCD1234/B05EFGH5678/q9Wv3XyZ7tLmN2pR8sK4dF6h?thread=1"
    line = f'https://hooks.slack.com:443 "POST {path} HTTP/1.1" 404 9'
    clean, hits = Scrubber.from_environ(env).text(line)
    assert hits == 1 and "q9Wv3XyZ7" not in clean and "hooks.slack.com:443" in clean
    short = "http://localhost:9000/api"  # a path too short to scrub wherever it appears
    assert secret_values({"AWS_ENDPOINT_URL": short}) == (short,)


def test_default_secret_names_cover_the_common_forms() -> None:
    for name in [
        "GITHUB_PAT",
        "NPM_AUTH",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "MY_SECRET_X",
        "DB_PASSWORD",
        "OPENAI_API_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AZURE_CLIENT_SECRET",
        "GCP_SA_JSON",
        "github_pat",
    ]:
        assert is_secret_name(name), name
    for name in ["PATH", "HOME", "NCCL_DEBUG", "PATHS", "AUTHOR", "CUDA_VISIBLE_DEVICES"]:
        assert not is_secret_name(name), name
    assert "*_PAT" in DEFAULT_SECRET_PATTERNS and "*_AUTH" in DEFAULT_SECRET_PATTERNS


def test_webhooks_dsns_and_jwts_are_secret_names() -> None:
    for name in [
        "SLACK_WEBHOOK_URL",
        "DISCORD_WEBHOOK",
        "WEBHOOK_URL",
        "SENTRY_DSN",
        "DSN",
        "SENTRY_DSN_PUBLIC",
        "SERVICE_JWT",
        "JWT",
        "GITHUB_OIDC_JWT_VALUE",
    ]:
        assert is_secret_name(name), name


def test_password_variables_named_pass_or_pwd_are_secret_names() -> None:
    for name in ["SMTP_PASS", "DB_PASS", "DB_PASS_FILE", "MYSQL_PWD", "PGPASS_PWD"]:
        assert is_secret_name(name), name
    for name in ["PWD", "OLDPWD", "BYPASS", "COMPASS_HOME"]:  # the working folder, not secrets
        assert not is_secret_name(name), name


def test_a_secret_percent_encoded_with_lowercase_escapes_is_scrubbed() -> None:
    secret = "s3cr3t/Value+with=chars-" + "Q" * 40
    upper = quote(secret, safe="")
    lower = re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), upper)
    assert lower != upper
    clean, _ = Scrubber.of([secret]).text(f"GET /cb?auth={lower} HTTP/1.1")
    assert SCRUBBED in clean and lower not in clean


def test_the_names_the_harness_records_are_not_secret_names() -> None:
    """What the harness and its ranks set or keep must stay readable in the receipt."""
    for name in [
        "DCPQUAL_RUN_DCP_COMM_BACKEND",
        "DCPQUAL_RUN_KV_CACHE_DTYPE",
        "DCPQUAL_ZYGOTE_SOCKET",
        "DCPQUAL_PLAN",
        "LOCAL_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_ERROR_FILE",
        "TORCH_CUDA_ARCH_LIST",
        "TORCH_DISTRIBUTED_DEBUG",
        "NCCL_IB_DISABLE",
        "NCCL_SOCKET_IFNAME",
        "VLLM_USE_BYTECODE_HOOK",
        "VLLM_DIST_IDENT",
        "VLLM_HOST_IP",
        "B12X_MLA",
        "PYTEST_ADDOPTS",
        "PYTHONHASHSEED",
        "OMP_NUM_THREADS",
    ]:
        assert not is_secret_name(name), name


def test_passphrases_are_secret_names_and_shapes() -> None:
    """A signing key's passphrase (GPG_PASSPHRASE, MAVEN_GPG_PASSPHRASE in CI) is a password: a
    test that prints the environment it hands a subprocess must not print it."""
    env = {"GPG_PASSPHRASE": "correct horse battery", "MAVEN_GPG_PASSPHRASE": "Tr0ub4dor&3xyz"}
    assert all(is_secret_name(name) for name in env)
    scrub = Scrubber.from_environ(env)
    clean, hits = scrub.text(f"env for the subprocess: {env}")
    assert hits == 2 and "battery" not in clean and "Tr0ub4dor" not in clean
    # by its shape too, where the environment does not hold it
    clean, _ = Scrubber.of([]).text("gpg --batch passphrase=hunter2xyz; Passphrase: s3cr3t-words")
    assert "hunter2xyz" not in clean and "s3cr3t-words" not in clean


def test_more_secret_names_can_be_configured_never_fewer() -> None:
    env = {"ACME_SIGIL": "acme-value-123", "HF_TOKEN": "hf-value-1234", PATTERNS_ENV: ""}
    assert secret_values(env) == ("hf-value-1234",)
    env[PATTERNS_ENV] = "acme_*, *SIGIL"
    assert set(secret_values(env)) == {"acme-value-123", "hf-value-1234"}


def test_a_secret_in_a_file_or_folder_name_is_renamed_and_links_are_not_read(
    tmp_path: Path,
) -> None:
    secret = "hf_name0123456789"
    (tmp_path / f"dir-{secret}").mkdir()
    (tmp_path / f"dir-{secret}" / f"{secret}.txt").write_text(f"value {secret}\n")
    (tmp_path / "plain.txt").write_text("nothing here\n")
    os.mkfifo(tmp_path / "fifo")  # reading it would block forever
    (tmp_path / "link").symlink_to("/etc/hostname")
    report = scrub_folder(tmp_path, Scrubber.of([secret]))
    names = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert not any(secret in n for n in names), names
    assert f"dir-{SCRUBBED}/{SCRUBBED}.txt" in names
    assert (tmp_path / f"dir-{SCRUBBED}" / f"{SCRUBBED}.txt").read_text() == f"value {SCRUBBED}\n"
    assert report.changed == (f"dir-{SCRUBBED}/{SCRUBBED}.txt",)
    assert not any(secret in old or secret in new for old, new in report.renamed)
    assert len(report.renamed) == 2


def test_a_secret_with_a_slash_made_a_path_is_scrubbed_from_every_name_it_spans(
    tmp_path: Path,
) -> None:
    """An AWS secret key holds '/': a cache a test names by it is several folders, each holding a
    piece of the key; every piece is renamed, and no report names one."""
    key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    made = [tmp_path / "cache" / f"{key}.json", tmp_path / "auth" / f"by-{key}-v2" / "x"]
    for path in made:
        path.parent.mkdir(parents=True)
        path.write_text("{}\n")
    (tmp_path / "cache" / "plain").mkdir()
    report = scrub_folder(tmp_path, Scrubber.of([key]))
    names = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    pieces = key.split("/")
    assert not [n for n in names if any(piece in n for piece in pieces)], names
    assert f"cache/{SCRUBBED}/{SCRUBBED}/{SCRUBBED}.json" in names and "cache/plain" in names
    assert f"auth/by-{SCRUBBED}/{SCRUBBED}/{SCRUBBED}-v2/x" in names
    shown = " ".join(old + " " + new for old, new in report.renamed)
    assert not [piece for piece in pieces if piece in shown], report.renamed


def test_without_the_print_forms_a_repr_with_a_quote_leaks() -> None:
    """Negative control: scrubbing only the raw value misses what assertion introspection
    prints, so the print forms above are what the property tests rely on."""
    secret = "hf_it's\\secret"
    printed = f"AssertionError: {secret!r}"
    raw_only = Scrubber((secret,))
    clean, _ = raw_only.text(printed)
    assert "secret" in ast.literal_eval(clean.removeprefix("AssertionError: "))
    assert core(secret) not in Scrubber.of([secret]).text(printed)[0].replace("\\\\", "\\")


def test_logging_strips_the_value_and_the_stripped_form_is_scrubbed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "hf_trailing0123456789\n"
    logging.getLogger("leaky").warning("token %s", secret.strip())
    clean, hits = Scrubber.of([secret]).text(caplog.text)
    assert hits == 1 and secret.strip() not in clean


def recoverable(text: str, secret: str) -> bool:
    """Whether a reader decoding `text` the usual ways finds the secret: any run of base64
    (either alphabet, at any alignment) or hex characters decoded, or the text unquoted."""
    target = core(secret).encode()
    if any(target in t.encode() for t in (text, unquote(text), unquote_plus(text))):
        return True
    for run in re.findall(r"[A-Za-z0-9+/_-]{8,}", text):
        run = run.translate(str.maketrans("-_", "+/"))
        for skip in range(4):
            chunk = run[skip:]
            chunk += "=" * (-len(chunk) % 4)
            try:
                if target in base64.b64decode(chunk, validate=True):
                    return True
            except (binascii.Error, ValueError):
                pass
    for run in re.findall(r"[0-9a-fA-F]{8,}", text):
        for skip in range(2):
            chunk = run[skip:]
            if target in bytes.fromhex(chunk[: len(chunk) - len(chunk) % 2]):
                return True
    return False


def encoded_lines(secret: str) -> list[str]:
    raw = secret.encode()
    return [
        f"token={base64.b64encode(raw).decode()}",
        f"token={base64.b64encode(raw).decode().rstrip('=')}",
        f"token={base64.urlsafe_b64encode(raw).decode()}",
        f"token={base64.urlsafe_b64encode(raw).decode().rstrip('=')}",
        f"Authorization: Basic {base64.b64encode(b'user:' + raw).decode()}",  # inside a longer one
        f"Authorization: Basic {base64.b64encode(b'ab:' + raw + b':x').decode()}",
        f"cookie={base64.urlsafe_b64encode(b'k=' + raw).decode()}",
        f"GET https://example.com/cb?token={quote(secret)}&x=1",
        f"GET https://example.com/cb?token={quote(secret, safe='')}&x=1",
        f"POST body a=1&token={quote_plus(secret)}",
        f"hex {raw.hex()} HEX {raw.hex().upper()}",
        f"hex in a dump 00ff{(b'pad' + raw).hex()}00",
    ]


@SETTINGS
@given(SECRETS)
def test_a_log_holding_the_secret_base64_percent_or_hex_encoded_keeps_no_copy(
    secret: str,
) -> None:
    usable(secret)
    lines = encoded_lines(secret)
    assume(core(secret) not in "\n".join(encoded_lines("")))
    clean, hits = Scrubber.of([secret]).text("\n".join(lines))
    assert hits >= len(lines)
    for line in clean.split("\n"):
        assert not recoverable(line, secret), line


@SETTINGS
@given(SECRETS)
def test_an_encoded_secret_in_a_json_record_keeps_no_copy(secret: str) -> None:
    usable(secret)
    doc = {"headers": {"Authorization": "Basic " + base64.b64encode(secret.encode()).decode()}}
    doc["url"] = "https://example.com/?t=" + quote_plus(secret)  # type: ignore[assignment]
    clean, hits = Scrubber.of([secret]).json_bytes(json.dumps(doc).encode())
    assert hits >= 2
    assert not any(recoverable(s, secret) for s in strings_in(json.loads(clean)))


def test_an_encoded_secret_in_a_file_name_is_renamed(tmp_path: Path) -> None:
    secret = "hf_it's/a+secret~value?"
    raw = secret.encode()
    names = [
        base64.urlsafe_b64encode(raw).decode(),
        raw.hex(),
        quote(secret, safe=""),
        quote_plus(secret),
    ]
    for n, name in enumerate(names):
        (tmp_path / f"{n}-{name}.log").write_text("x")
    scrub_folder(tmp_path, Scrubber.of([secret]))
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == len(names) and not any(recoverable(n, secret) for n in left), left


def test_an_encoded_short_value_is_not_scrubbed() -> None:
    short = "x" * (MIN_SCRUB_LENGTH - 1)
    assert Scrubber.of([short]).forms == ()
    text = f"{base64.b64encode(short.encode()).decode()} {short.encode().hex()}"
    assert Scrubber.of([short]).text(text) == (text, 0)


@SETTINGS
@given(st.lists(SECRETS, min_size=1, max_size=3))
def test_every_form_holds_an_anchor_so_a_text_without_one_is_rightly_passed_over(
    secrets: list[str],
) -> None:
    scrub = Scrubber.of(secrets)
    assert all(any(anchor in form for anchor in scrub.anchors) for form in scrub.forms)
    assert len(scrub.anchors) <= len(scrub.forms)


def comments_and_pis(xml: bytes) -> list[str]:
    """Every comment's and PI's text in a document, the ones around the root too."""
    found: list[str] = []
    parser = ET.XMLPullParser(events=("comment", "pi"))
    parser.feed(xml)
    parser.close()
    for _event, node in parser.read_events():
        found.append(node.text or "")
    return found


@pytest.mark.parametrize("also_in_text", [False, True])
def test_xml_comments_and_processing_instructions_are_kept_and_scrubbed(
    also_in_text: bool,
) -> None:
    secret = "hf_comment0123456789"
    body = secret if also_in_text else "plain"
    xml = (
        "<?xml version='1.0' encoding='utf-8'?>\n"
        f"<!-- written for {secret} -->\n<?xml-stylesheet href='{secret}.xsl'?>\n"
        f"<testsuite><!-- env HF_TOKEN={secret} --><testcase name='t'>{body}</testcase>"
        f"<?trace token={secret}?></testsuite>\n<!-- end -->"
    ).encode()
    clean, hits = Scrubber.of([secret]).xml_bytes(xml)
    assert hits == (5 if also_in_text else 4)
    assert secret.encode() not in clean
    assert comments_and_pis(clean) == [
        f" written for {SCRUBBED} ",
        f"xml-stylesheet href='{SCRUBBED}.xsl'",
        f" env HF_TOKEN={SCRUBBED} ",
        f"trace token={SCRUBBED}",
        " end ",
    ]
    parsed = ET.fromstring(clean)
    assert [e.tag for e in parsed.iter()] == ["testsuite", "testcase"]
    assert parsed[0].text == (SCRUBBED if also_in_text else "plain")


def test_a_pi_target_equal_to_the_secret_is_a_word_of_the_structure() -> None:
    clean, hits = Scrubber.of(["stylesheet"]).xml_bytes(b"<a><?stylesheet stylesheet?></a>")
    assert hits == 1 and comments_and_pis(clean) == [f"stylesheet {SCRUBBED}"]


def test_an_xml_document_type_is_scrubbed_too() -> None:
    secret = "hf_doctype0123456789"
    xml = f'<!DOCTYPE a [<!ENTITY unused "{secret}">]><a>plain</a>'.encode()
    clean, hits = Scrubber.of([secret]).xml_bytes(xml)
    assert hits == 1 and secret.encode() not in clean


@pytest.mark.parametrize(
    "name, value, password",
    [
        ("DATABASE_URL", "postgres://qual:s3cr3t-word@db.internal:5432/runs", "s3cr3t-word"),
        ("HTTP_PROXY", "http://me:proxy-pass-1@proxy:3128", "proxy-pass-1"),
        ("https_proxy", "https://me:p@ss:w0rd!@proxy:3128/", "p@ss:w0rd!"),
        (
            "PIP_INDEX_URL",
            "https://__token__:pypi-AgEIcHlwaS@pypi.example/simple",
            "pypi-AgEIcHlwaS",
        ),
        ("PIP_EXTRA_INDEX_URL", "https://a:first-pass@x/s https://b:second-pw@y/s", "second-pw"),
    ],
)
def test_a_password_in_a_url_in_any_variable_is_a_secret(
    name: str, value: str, password: str
) -> None:
    assert not is_secret_name(name)
    env = {name: value, "PATH": "/usr/bin"}
    assert password in secret_values(env)
    clean, hits = Scrubber.from_environ(env).text(f"pip: using {value}\n")
    assert hits >= 1 and password not in clean
    assert "@" in clean and "://" in clean  # the rest of the URL stays readable


def test_a_percent_encoded_url_password_is_scrubbed_encoded_and_decoded() -> None:
    env = {"DATABASE_URL": "mysql://root:p%40ss%2Fword%21@db/x"}
    assert {"p%40ss%2Fword%21", "p@ss/word!"} <= set(secret_values(env))
    clean, _ = Scrubber.from_environ(env).text(
        "connect p@ss/word! via mysql://root:p%40ss%2Fword%21@db"
    )
    assert "word" not in clean


def test_urls_without_a_password_or_with_a_short_one_give_no_secret() -> None:
    env = {
        "HTTP_PROXY": "http://proxy.internal:3128",
        "NO_PROXY": "localhost,127.0.0.1",
        "REPO": "ssh://git@github.com/org/repo",
        "DATABASE_URL": "postgres://u:short@db/x",  # too short to scrub from files
    }
    assert secret_values(env) == ()


# -- base64 wrapped into lines, as MIME, the `base64` tool and `base64.encodebytes` write it --


def base64_holds(text: str, secret: str) -> bool:
    """Whether the base64 in `text` decodes to the secret once its line breaks are removed (as
    `base64 -d` reads it): any run, at any of the four alignments, cut to whole groups."""
    target = core(secret).encode()
    for run in re.findall(r"[A-Za-z0-9+/]{8,}", re.sub(r"\r?\n", "", text)):
        for skip in range(4):
            chunk = run[skip:]
            if target in base64.b64decode(chunk[: len(chunk) - len(chunk) % 4]):
                return True
    return False


# Most paddings leave the secret's encoding whole on one line (the test wants it cut): many
# examples are filtered out by design.
@settings(SETTINGS, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(SECRETS, st.integers(0, 120), st.sampled_from([76, 64]), st.sampled_from(["\n", "\r\n"]))
def test_a_secret_in_line_wrapped_base64_keeps_no_copy(
    secret: str, pad: int, width: int, newline: str
) -> None:
    usable(secret)
    encoded = base64.b64encode(b"p" * pad + secret.encode() + b"|tail").decode()
    lines = [encoded[i : i + width] for i in range(0, len(encoded), width)]
    assume(not any(base64_holds(line, secret) for line in lines))  # its encoding is cut
    text = newline.join(["Content-Transfer-Encoding: base64", "", *lines, "--end--", ""])
    scrub = Scrubber.of([secret])
    clean, hits = scrub.text(text)
    assert hits >= 1 and not base64_holds(clean, secret)
    assert clean.startswith("Content-Transfer-Encoding: base64") and "--end--" in clean
    data, hits = scrub.data(text.encode())
    assert hits >= 1 and not base64_holds(data.decode(), secret)


def test_lines_of_base64_holding_no_secret_are_left_as_they_are() -> None:
    block = base64.encodebytes(bytes(range(256)) * 3).decode()
    assert Scrubber.of(["hf_not0in0this0block"]).text(block) == (block, 0)


# -- credentials by their shape, whatever the environment holds ---------------------------------

NOTHING_SECRET: dict[str, str] = {"PATH": "/usr/bin", "HOME": "/root"}


@pytest.mark.parametrize(
    "url, credential, shown",
    [
        (
            "https://ghp_0123456789abcdefABCDEF@github.com/org/repo.git",
            "ghp_",
            f"https://{SCRUBBED}@github.com/org/repo.git",
        ),
        (
            "https://oauth2:glpat-Xy12Zz@gitlab.example/org/r.git",
            "glpat-Xy12Zz",
            f"https://oauth2:{SCRUBBED}@gitlab.example/org/r.git",
        ),
        (
            "https://x-access-token:ghs_s@github.com/o/r",
            "ghs_s",
            f"https://x-access-token:{SCRUBBED}@github.com/o/r",
        ),
        ("https://me:p@ss:w0rd!@proxy:3128/", "w0rd", f"https://me:{SCRUBBED}@proxy:3128/"),
        (
            "postgres://qual:pw@db.internal:5432/runs",
            "qual:pw",
            f"postgres://qual:{SCRUBBED}@db.internal:5432/runs",
        ),
    ],
)
def test_the_credential_of_a_url_is_redacted_whatever_the_environment_holds(
    url: str, credential: str, shown: str
) -> None:
    """A password, or a bare userinfo that looks issued; the user name and host stay."""
    scrub = Scrubber.from_environ(NOTHING_SECRET)
    assert scrub.forms == ()
    clean, hits = scrub.text(f"+ git clone {url} here\n")
    assert hits == 1 and credential not in clean
    assert clean == f"+ git clone {shown} here\n"


@pytest.mark.parametrize(
    "text",
    [
        "ssh://git@github.com/org/repo.git",
        "ssh://ci@build.example:22/",
        "test_clone[ssh://deploy@host/r.git]",
        "MAX_TOKENS=64 TOKENIZERS_PARALLELISM=false NUM_KEYS=3",
        "assert 'CACHE_KEY=abc123' == 'CACHE_KEY=abc124'",
        "{'MAX_TOKENS': 64, 'NUM_KEYS': 3}",
        "tests/test_limits.py::test_limit[MAX_TOKENS=128]",
    ],
)
def test_user_names_numbers_switches_and_short_settings_are_left_readable(text: str) -> None:
    """Evidence a reviewer reads and a rerun selects by: a user name, a count, a switch, a
    short setting under a name that merely looks secret (a test id, an assertion's diff)."""
    assert Scrubber.from_environ(NOTHING_SECRET).text(text) == (text, 0)


def test_a_short_value_is_a_credential_where_its_name_says_password_or_secret() -> None:
    scrub = Scrubber.from_environ(NOTHING_SECRET)
    assert scrub.text("DB_PASSWORD=pw1 API_SECRET=s3 PIN_PWD=4711 USE_SECRET=true")[0] == (
        f"DB_PASSWORD={SCRUBBED} API_SECRET={SCRUBBED} PIN_PWD={SCRUBBED} USE_SECRET=true"
    )


@pytest.mark.parametrize(
    "line, value",
    [
        ("HF_TOKEN=hf_NotInThisEnvironment0", "hf_NotInThisEnvironment0"),
        ("export DB_PASSWORD='two words'", "two words"),
        ('docker run -e AWS_SECRET_ACCESS_KEY="abc/de+f" img', "abc/de+f"),
        ("env GITHUB_PAT=ghp_x1y2z3w4 make", "ghp_x1y2z3w4"),
        ("test_login[MY_SECRET=s3]", "s3"),
        ("environ({'HOME': '/root', 'HF_TOKEN': 'hf_dict_repr'})", "hf_dict_repr"),
        ('{"NPM_AUTH": "npm_in_json_text", "n": 1}', "npm_in_json_text"),
    ],
)
def test_the_value_of_a_secret_named_assignment_is_redacted_whatever_the_environment_holds(
    line: str, value: str
) -> None:
    scrub = Scrubber.from_environ(NOTHING_SECRET)
    clean, hits = scrub.text(line)
    assert hits == 1 and value not in clean and SCRUBBED in clean
    name = re.findall(r"[A-Z][A-Z_]+(?=['\"]?[=:])", line)[-1]
    assert name in clean  # which variable it was stays readable
    assert scrub.text(clean) == (clean, 0)  # and scrubbing again changes nothing


@pytest.mark.parametrize(
    "line",
    [
        "signature(total_heads=16, max_tokens=8192, dtype='bf16')",  # lower case: code, not env
        "NCCL_DEBUG=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL OMP_NUM_THREADS=1",  # not secret names
        f"{PATTERNS_ENV}=acme_*",  # the setting that names secrets is none itself
        "HF_TOKEN=<redacted> DB_PASSWORD=[REDACTED] PIP_PASS=****",  # already replaced
        "HF_TOKEN= DB_PASSWORD=''",  # nothing to hide
        "see https://github.com/org/repo and mail me@example.com",  # no userinfo
        "https://[REDACTED]@github.com/org/repo https://****@h/",
    ],
)
def test_text_that_only_looks_like_a_credential_is_left_as_it_is(line: str) -> None:
    assert Scrubber.from_environ(NOTHING_SECRET).text(line) == (line, 0)


def test_credentials_by_their_shape_are_scrubbed_from_every_kind_of_file(tmp_path: Path) -> None:
    url = "https://ghp_ShapeOnly0123456789@github.com/org/repo"
    (tmp_path / "run.log").write_text(f"cloning {url}\nHF_TOKEN=hf_shape_only\n")
    (tmp_path / "rank-00.json").write_text(
        json.dumps({"message": f"git clone {url}", "env": {"HF_TOKEN": "hf_shape_only"}})
    )
    (tmp_path / "rank-00.xml").write_text(
        f"<testsuite><testcase name='t'><system-out>{url} HF_TOKEN=hf_shape_only"
        "</system-out></testcase></testsuite>"
    )
    (tmp_path / "HF_TOKEN=hf_shape_only.txt").write_text("x")
    report = scrub_folder(tmp_path, Scrubber.from_environ(NOTHING_SECRET))
    for path in tmp_path.iterdir():
        assert "hf_shape_only" not in path.name and "ghp_" not in path.name
        assert b"hf_shape_only" not in path.read_bytes() and b"ghp_" not in path.read_bytes()
    assert report.changed == ("rank-00.json", "rank-00.xml", "run.log")
    record = json.loads((tmp_path / "rank-00.json").read_text())
    assert record["env"] == {"HF_TOKEN": SCRUBBED}
    assert record["message"] == f"git clone https://{SCRUBBED}@github.com/org/repo"


def test_a_scrubber_without_the_shape_rules_leaves_them_to_the_values() -> None:
    """What the negative controls use: no redaction at all."""
    line = "HF_TOKEN=hf_value https://user@host/"
    assert not Scrubber((), shapes=False)
    assert Scrubber((), shapes=False).text(line) == (line, 0)


# -- values too short to scrub wherever they appear -----------------------------------------------


def test_a_short_secret_value_is_scrubbed_where_its_name_says_what_it_is() -> None:
    """A value shorter than MIN_SCRUB_LENGTH ("1", "true", a short password) would corrupt every
    file if scrubbed wherever it appears; it is scrubbed where the text names it a password or
    secret (a short value of another secret-looking name is a setting: a profile, a count)."""
    env = {"DB_PASSWORD": "pw1", "AWS_PROFILE": "dev"}
    scrub = Scrubber.from_environ(env)
    assert secret_values(env) == () and scrub.forms == ()
    clean, hits = scrub.text("DB_PASSWORD=pw1 AWS_PROFILE=dev; login with pw1 on dev")
    assert clean == f"DB_PASSWORD={SCRUBBED} AWS_PROFILE=dev; login with pw1 on dev"
    assert hits == 1


_SHAPED = st.lists(
    st.one_of(
        st.sampled_from(["HF_TOKEN", "DB_PASSWORD", "NCCL_DEBUG", "=", "'", '"', ": ", "://"]),
        st.sampled_from(["@", "/", " ", "\n", "]", "[", "*", "<", "x_KEY", "a:b", SCRUBBED]),
        st.text(_CHARS, max_size=6),
    ),
    max_size=14,
).map("".join)


@SETTINGS
@given(_SHAPED, st.sampled_from(["", "hf_known0123456789"]))
def test_scrubbing_what_was_scrubbed_changes_nothing(text: str, known: str) -> None:
    """The writer scrubs what the launcher already scrubbed, and the receipt built from
    scrubbed files is scrubbed again: a second pass must find nothing."""
    scrub = Scrubber.from_environ({"HF_TOKEN": known} if known else NOTHING_SECRET)
    once, _ = scrub.text(text + known)
    assert scrub.text(once) == (once, 0)
    data, _ = scrub.data((text + known).encode())
    assert scrub.data(data) == (data, 0)


# -- folders the run left locked ---------------------------------------------------------------

LOCKED = "hf_LockedFolderSecret0123456789"


@pytest.mark.parametrize("mode", [0o000, 0o300, 0o400], ids=["000", "wx", "r"])
def test_a_folder_the_run_locked_is_opened_and_scrubbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    """A folder its owner cannot list (000, 0o300) or enter (0o400) could hide a secret from a
    walk that skips it; the scrub gives it back to its owner (u+rwx) and goes in."""
    hold_to_modes(monkeypatch, tmp_path)
    locked = tmp_path / "out" / "notes" / "locked"
    (locked / "inner").mkdir(parents=True)
    (locked / "a.txt").write_text(f"HF_TOKEN={LOCKED}\n")
    (locked / "inner" / "b.txt").write_text(f"HF_TOKEN={LOCKED}\n")
    (locked / f"{LOCKED}.log").write_text("named after it\n")
    lock(locked / "inner", mode)
    lock(locked, mode)

    report = scrub_folder(tmp_path / "out", Scrubber.of([LOCKED]))

    assert report.changed == ("notes/locked/a.txt", "notes/locked/inner/b.txt")
    assert report.renamed == ((f"notes/locked/{SCRUBBED}.log", f"notes/locked/{SCRUBBED}.log"),)
    assert report.removed == ()
    unlock_all(tmp_path / "out")
    assert (locked / "a.txt").read_text() == f"HF_TOKEN={SCRUBBED}\n"
    assert (locked / "inner" / "b.txt").read_text() == f"HF_TOKEN={SCRUBBED}\n"


def test_a_locked_folder_that_cannot_be_opened_is_removed_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where its mode cannot be changed (not the run's own, immutable), a folder that cannot be
    listed is removed, as a file that cannot be scrubbed is, and named as removed."""
    hold_to_modes(monkeypatch, tmp_path)
    out = tmp_path / "out"
    lock(out / "notes" / "locked")
    (out / "notes" / "kept.txt").write_text("nothing secret\n")
    refuse_chmod(monkeypatch, out)

    report = scrub_folder(out, Scrubber.of([LOCKED]))

    assert report.removed == ("notes/locked/",)
    assert sorted(p.name for p in (out / "notes").iterdir()) == ["kept.txt"]


def test_a_locked_folder_that_can_be_neither_opened_nor_removed_stops_the_scrub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold_to_modes(monkeypatch, tmp_path)
    out = tmp_path / "out"
    (out / "locked").mkdir(parents=True)
    (out / "locked" / "a.txt").write_text(f"HF_TOKEN={LOCKED}\n")
    lock(out / "locked")
    refuse_chmod(monkeypatch, out)

    with pytest.raises(ScrubFailed, match=r"^locked/ still holds a secret") as failed:
        scrub_folder(out, Scrubber.of([LOCKED]))
    assert failed.value.left == ("locked/",)


def test_a_gzip_file_holding_the_secret_keeps_no_copy(tmp_path: Path) -> None:
    """A compressed log (and a JSON dump, two gzip members) a test left in the out folder: the
    secret is not in the bytes as written, so it is looked for in what they hold."""
    import gzip

    secret = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123"
    (tmp_path / "log.gz").write_bytes(gzip.compress(f"using token {secret}\n".encode()))
    dump = json.dumps({"config": {"auth": secret}}).encode()
    (tmp_path / "dump.json.gz").write_bytes(gzip.compress(dump[:10]) + gzip.compress(dump[10:]))
    report = scrub_folder(tmp_path, Scrubber.of([secret]))
    assert report.changed == ("dump.json.gz", "log.gz")
    log = gzip.decompress((tmp_path / "log.gz").read_bytes()).decode()
    assert log == f"using token {SCRUBBED}\n"
    held = json.loads(gzip.decompress((tmp_path / "dump.json.gz").read_bytes()))
    assert held == {"config": {"auth": SCRUBBED}}
