"""summary.md as dcpqual wrote it before its first screen said what was qualified (receipts
without `skip_reasons`), so `dcpqual verify` and `dcpqual compare` (and the nightly's archive)
still accept the bundles written then. Frozen: never change its output;
`harness.evidence.summary` is the current layout."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from harness.evidence import markdown as md
from harness.evidence.short_summary import RERUN_PREFIX, first_line, rerun_command
from harness.schema.receipt import Ranks, Receipt

RECEIPT_SHA_LINE = "receipt.json sha256: `{}`"
WIDTH = 80


def _rule(text: str, char: str = "=") -> str:
    text = f" {text} "
    left = max(3, (WIDTH - len(text)) // 2)
    right = max(3, WIDTH - len(text) - left)
    return f"{char * left}{text}{char * right}"


def tallies_line(receipt: Receipt) -> str:
    """`1 failed, 4 passed, 1 skipped in 12.3s`, pytest's words and order."""
    counts = {"failed": 0, "passed": 0, "skipped": 0, "errors": 0}
    for tally in receipt.suites.values():
        counts["failed"] += tally.failed
        counts["passed"] += tally.passed
        counts["skipped"] += tally.skipped
        counts["errors"] += tally.errors
    parts = [f"{n} {word}" for word, n in counts.items() if n]
    if counts["errors"] == 1:
        parts[-1] = "1 error"
    launch = receipt.run.extra.launch
    wall = "" if launch is None else f" in {launch.elapsed_s:.1f}s"
    return f"{', '.join(parts) or 'no tests ran'}{wall}"


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "rank ?"
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def ending_lines(receipt: Receipt, bundle: Path | None) -> list[str]:
    """The closing block: short summary (failures only), tallies rule, rerun command."""
    lines: list[str] = []
    if receipt.verdict == "fail":
        lines.append(_rule("short test summary info"))
        for test in receipt.failed_tests:
            message = f" - {_ranks(test.ranks)}: {test.message}" if test.message else ""
            word = "FAILED" if test.outcome == "failed" else "ERROR"
            lines.append(f"{word} {test.nodeid}{message}")
        if not receipt.failed_tests:
            for reason in receipt.failures or ["the run failed"]:
                lines.append(f"FAILED run - {first_line(reason)}")
    lines.append(_rule(f"{tallies_line(receipt)} ({receipt.verdict.upper()})"))
    if receipt.failed_tests and bundle is not None:
        lines.append(f"{RERUN_PREFIX}{rerun_command(bundle)}")
    return lines


def _cell(markdown: object) -> str:
    return md.cell(str(markdown))


def _ranks_line(ranks: Ranks) -> str:
    line = f"{ranks.complete}/{ranks.expected} complete, killed {ranks.killed}"
    if ranks.stopped:
        line += f", of them stopped by the run's fault {ranks.stopped}"
    return line


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _fence(text: str) -> list[str]:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + "text", text, fence]


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _ending(receipt: Receipt, bundle: Path | None) -> list[str]:
    """The pytest-style ending, first thing under the title (a reader looks there first)."""
    return [*_fence("\n".join(ending_lines(receipt, bundle))), ""]


def render_summary(
    receipt: Receipt, receipt_sha256: str, bundle: Path | None = None, *, with_host: bool = False
) -> str:
    """The layout of then; `with_host`: as it was before host names left summary.md."""
    r = receipt
    g = r.geometry
    env = r.environment
    lines = [f"# dcpqual: {r.verdict.upper()} ({r.status})", ""]
    lines += _ending(r, bundle)
    image = "none (source checkout)"
    if r.image is not None:
        image = md.text(f"{r.image.reference or '(unnamed)'} @ {r.image.digest or 'no digest'}")
    sources = []
    for name, src in sorted(r.sources.items()):
        ident = md.text(src.version or "")
        if src.commit:
            ident += f" commit {md.code(src.commit[:12])}"
        if src.tree:
            ident += f" tree {md.code(src.tree[:12])}"
        if src.dirty:
            ident += " (dirty)"
        sources.append(f"{md.text(name)} {ident.strip()}")
    gpus = md.text(", ".join(sorted(set(env.device_names))))
    overview = [
        ["verdict", f"**{r.verdict}**"],
        ["status", f"`{r.status}`"],
        [
            "geometry",
            f"{g.world_size} ranks ({g.nnodes} node x {g.nproc_per_node}), backend {g.backend}, "
            f"TP{g.tp} / DCP{g.dcp}",
        ],
        ["warm code", md.text(r.warm_impl)],
        ["image", image],
        ["sources", "; ".join(sources) or "unknown"],
        [
            "environment",
            md.text(
                f"torch {env.torch}, CUDA {env.cuda or '-'}, NCCL {env.nccl or '-'}, "
                f"Python {env.python}" + (f", host {env.host}" if with_host else "")
            ),
        ],
        [
            "devices",
            f"{len(env.gpus)} x {gpus}, driver {md.text(env.driver or '?')}" if env.gpus else gpus,
        ],
        ["ranks", _ranks_line(r.ranks)],
        [
            "run",
            f"exit {r.run.exit_code}{', timed out' if r.run.timed_out else ''}, "
            + md.text(f"{r.run.started_at or '?'} -> {r.run.finished_at or '?'}"),
        ],
    ]
    lines += _table(["", ""], overview)

    lines += ["", "## Transport signatures", ""]
    if r.signatures:
        rows: list[list[object]] = [
            [
                md.text(s.model),
                s.total_heads,
                s.query_head_dim,
                s.output_head_dim,
                md.text(s.dtype),
                s.dcp_world_size,
                _yes(s.warmed),
                "yes" if s.used_in_capture else "no",
                len(s.ranks),
            ]
            for s in r.signatures
        ]
        lines += _table(
            ["model", "heads", "q dim", "out dim", "dtype", "dcp", "warmed", "used", "ranks"], rows
        )
    else:
        lines.append("No capture window reported a signature.")

    c = r.capture
    nc = r.negative_control
    paths = md.text(", ".join(f"{n} {p}" for p, n in sorted(c.paths.items())) or "none")
    lines += ["", "## Capture", ""]
    lines.append(f"- lazy events: **{c.lazy_events}** over {c.windows} windows ({paths})")
    if c.by_detector:
        lines.append(
            "- by detector: "
            + md.text(", ".join(f"{d} {n}" for d, n in sorted(c.by_detector.items())))
        )
    for event in c.events[:10]:
        lines.append(
            f"  - rank {event.rank}, {md.code(event.test)}: {md.text(event.detector)}: "
            f"{md.text(event.what)}"
        )
    if len(c.events) > 10:
        lines.append(f"  - ... {len(c.events) - 10} more in receipt.json")
    lines.append(
        f"- negative control: {nc.detected}/{nc.expected} windows detected, "
        f"{nc.lazy_events} provoked events"
    )

    lines += ["", "## Suites", ""]
    tally_rows: list[list[object]] = [
        [md.text(name), t.passed, t.failed, t.skipped, t.errors, t.rank_cases]
        for name, t in sorted(r.suites.items())
    ]
    lines += _table(["suite", "passed", "failed", "skipped", "errors", "rank cases"], tally_rows)

    lines += ["", "## Root cause", ""]
    if r.root_cause is None:
        lines.append("None: the run passed.")
    else:
        rc = r.root_cause
        where = "rank ?" if rc.rank is None else f"rank {rc.rank}"
        test = f", {md.code(rc.test)}" if rc.test else ""
        lines += [f"{where}{test} ({rc.kind}):", "", *_fence(rc.message)]
        if len(r.failures) > 1:
            lines += ["", "All reasons the run failed:", ""]
            lines += [f"- {md.text(reason)}" for reason in r.failures]

    lines += ["", "## Limitations", ""]
    lines += [f"- {md.text(item)}" for item in r.limitations] or ["- none"]
    lines += [
        "",
        "---",
        "",
        "Check the bundle with `dcpqual verify DIR`.",
        "",
        RECEIPT_SHA_LINE.format(receipt_sha256),
        "",
    ]
    return "\n".join(lines)
