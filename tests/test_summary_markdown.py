"""summary.md shows values from a run as text: a hostile test id or message stays inert.

Parsed with markdown-it-py (CommonMark plus GFM tables, as GitHub renders a pasted summary): no
link, image or raw HTML may appear, and a test id is one inline code span holding the id exactly.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from _support import forked_cli
from markdown_it import MarkdownIt
from markdown_it.token import Token

from harness.evidence import markdown as md

REPO = Path(__file__).resolve().parent.parent
ACTIVE = {"link_open", "image", "html_inline", "html_block"}
HOSTILE = [
    "x`[click](https://evil.example)<img src=x onerror=alert(1)>`|*y*",
    "``double`` and `single`",
    "`",
    " ` ",
    "trailing`",
    "<script>alert(1)</script>",
    "[a](javascript:alert(1)) ![i](http://x/i.png)",
    "- item\n# heading\n1. ordered\n> quote",
    "a|b||c \\| d",
    "**bold** _em_ ~~gone~~ $x^2$ &amp; &#96;",
    "line\r\nbreak\u2028sep",
    "\\`escaped backtick\\",
    "12) not a list",
]


def parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def tokens(markdown: str) -> list[Token]:
    out: list[Token] = []
    for token in parser().parse(markdown):
        out.append(token)
        out.extend(token.children or [])
    return out


def fuzz(seed: int, count: int = 300) -> list[str]:
    """Random strings over Markdown's punctuation: deterministic, and far from friendly."""
    rng = random.Random(seed)
    alphabet = "`*_[]()<>|\\!#~&$-+=.:/ \n ab1"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(count)]


@pytest.mark.parametrize("value", HOSTILE + fuzz(15))
def test_a_code_span_holds_the_value_exactly(value: str) -> None:
    found = [t for t in tokens(f"- rank 0, {md.code(value)}: done") if t.type == "code_inline"]
    assert [t.content for t in found] == [md.one_line(value)]


@pytest.mark.parametrize("value", HOSTILE + fuzz(16))
def test_text_renders_as_itself_and_nothing_else(value: str) -> None:
    found = tokens(f"- {md.text(value)}")
    assert [t.type for t in found if t.type not in ("text", "softbreak")] == [
        "bullet_list_open",
        "list_item_open",
        "paragraph_open",
        "inline",
        "paragraph_close",
        "list_item_close",
        "bullet_list_close",
    ]
    shown = "".join(t.content for t in found if t.type == "text")
    assert shown == md.one_line(value).strip(" ")  # a paragraph drops its outer spaces


@pytest.mark.parametrize("value", HOSTILE + fuzz(17, 100))
def test_a_table_cell_stays_one_cell(value: str) -> None:
    table = f"| a | b |\n|---|---|\n| {md.cell(md.text(value))} | {md.cell(md.code(value))} |\n"
    cells = [t for t in parser().parse(table) if t.type == "td_open"]
    assert len(cells) == 2


@pytest.mark.torchrun
@pytest.mark.slow
def test_a_hostile_test_id_cannot_break_out_of_summary_md(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    argv = ["run", "--nproc-per-node", "2", "--out", str(out)]
    argv += ["--timeout", "300", "--", "tests/rank_suites/rank_markdown.py"]
    done = forked_cli.run(argv, cwd=REPO, timeout=420)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    found = tokens(summary)
    assert not [t.type for t in found if t.type in ACTIVE]
    nodeid = (
        "tests/rank_suites/rank_markdown.py::test_hostile_id["
        "x`[click](https://evil.example)<img src=x onerror=alert(1)>`|*y*]"
    )
    assert nodeid in [t.content for t in found if t.type == "code_inline"]
    fences = [t for t in found if t.type == "fence"]
    assert fences and "<script>alert(1)</script>" in fences[0].content
