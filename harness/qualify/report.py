"""A `Comparison` as Markdown (a pull-request comment) or plain text (a terminal).

Receipt text (test ids, root-cause messages, host names) comes from the run under test, which in
PR qualification is the pull request's own code: every such value is shown as an inline code span
with backticks and line breaks removed, so it cannot add markup, links, mentions or rows.
"""

from __future__ import annotations

from harness.schema.compare import Comparison, SignatureUse, SuiteCounts

MAX_CELL = 160


def code(value: object) -> str:
    """Untrusted text as one inert inline code span that is safe inside a table cell."""
    text = " ".join(str(value).split()).replace("`", "'")
    if len(text) > MAX_CELL:
        text = text[: MAX_CELL - 3] + "..."
    return "`" + text.replace("|", "\\|") + "`" if text else ""


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> list[str]:
    return [_row(*header), _row(*("---" for _ in header)), *(_row(*r) for r in rows)]


def _use(u: SignatureUse | None) -> str:
    if u is None:
        return "absent"
    warmed = "warmed" if u.warmed else "**not warmed**"
    used = "used in capture" if u.used_in_capture else "not used"
    return f"{warmed}, {used}"


def _tally(t: SuiteCounts | None) -> str:
    if t is None:
        return "absent"
    return f"{t.passed} / {t.failed} / {t.skipped} / {t.errors}"


def _bullets(title: str, items: tuple[str, ...]) -> list[str]:
    if not items:
        return []
    return [f"**{title}**", "", *(f"- {code(i)}" for i in items), ""]


def render_markdown(c: Comparison) -> str:
    verdict = "REGRESSION" if c.regressed else "no regression"
    b, h = c.base, c.head
    lines = [
        f"### dcpqual compare: {verdict}",
        "",
        *_table(
            ("", "base", "head"),
            [
                ("bundle", code(b.path), code(h.path)),
                ("receipt.json sha256", code(b.receipt_sha256), code(h.receipt_sha256)),
                ("SHA256SUMS sha256", code(b.sums_sha256), code(h.sums_sha256)),
                ("verdict", code(b.verdict), code(h.verdict)),
                ("status", code(b.status), code(h.status)),
                ("warm impl", code(b.warm_impl), code(h.warm_impl)),
                ("geometry", code(b.geometry), code(h.geometry)),
                ("root cause", code(b.root_cause or "none"), code(h.root_cause or "none")),
            ],
        ),
        "",
        *_bullets("Regressions", c.regressions),
        *_bullets("Improvements", c.improvements),
        *_bullets("Notes", c.notes),
    ]
    changed = [s for s in c.signatures if s.change != "same"]
    lazy_rows = [s for s in c.signatures if s.change == "same" and s.head and s.head.lazy]
    lines += ["#### Transport signatures", ""]
    shown = changed + lazy_rows
    if shown:
        lines += _table(
            ("model", "signature", "base", "head", "change"),
            [
                (code(s.model), code(s.signature), _use(s.base), _use(s.head), s.change)
                for s in shown
            ],
        )
        lines.append("")
    unchanged = len(c.signatures) - len(shown)
    lines += [f"{unchanged} signature(s) unchanged.", ""]
    lines += ["#### Lazy events in capture", ""]
    if c.lazy_events:
        lines += _table(
            ("detector", "signature", "base", "head"),
            [(code(x.detector), code(x.signature), x.base, x.head) for x in c.lazy_events],
        )
    else:
        lines.append("None on either side.")
    lines += ["", "#### Suites (passed / failed / skipped / errors)", ""]
    lines += _table(
        ("suite", "base", "head"),
        [(code(s.name), _tally(s.base), _tally(s.head)) for s in c.suites],
    )
    lines += ["", "#### Environment and image", ""]
    if c.identity:
        lines += _table(
            ("field", "base", "head"),
            [
                (code(x.field), code(x.base or "absent"), code(x.head or "absent"))
                for x in c.identity
            ],
        )
    else:
        lines.append("Identical.")
    return "\n".join(lines).rstrip() + "\n"


def render_text(c: Comparison) -> str:
    b, h = c.base, c.head
    lines = [
        f"dcpqual compare: {'REGRESSION' if c.regressed else 'no regression'}",
        f"  base {b.path}: {b.verdict} ({b.status}), warm impl {b.warm_impl}, {b.geometry}",
        f"       receipt.json sha256 {b.receipt_sha256}",
        f"  head {h.path}: {h.verdict} ({h.status}), warm impl {h.warm_impl}, {h.geometry}",
        f"       receipt.json sha256 {h.receipt_sha256}",
    ]
    for title, items in (
        ("regressions", c.regressions),
        ("improvements", c.improvements),
        ("notes", c.notes),
    ):
        if items:
            lines.append(f"{title}:")
            lines += [f"  - {i}" for i in items]
    for s in c.signatures:
        if s.change != "same" or (s.head and s.head.lazy):
            lines.append(
                f"signature {s.model} {s.signature}: {_use(s.base)} -> {_use(s.head)} ({s.change})"
            )
    for count in c.lazy_events:
        lines.append(
            f"lazy events {count.detector} [{count.signature}]: {count.base} -> {count.head}"
        )
    for suite in c.suites:
        lines.append(f"suite {suite.name} (p/f/s/e): {_tally(suite.base)} -> {_tally(suite.head)}")
    for change in c.identity:
        lines.append(f"{change.field}: {change.base or 'absent'} -> {change.head or 'absent'}")
    return "\n".join(lines).replace("**", "") + "\n"
