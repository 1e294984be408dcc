"""`summary.md`: the receipt as Markdown, ready to paste into a pull request.

It ends with the sha256 of receipt.json, so a pasted summary names the exact receipt it came
from, and so `dcpqual verify` has a second witness for receipt.json besides SHA256SUMS.

The text is a pure function of the (scrubbed) receipt, its sha256 and the bundle path the
rerun line names, so `dcpqual verify` renders it again and rejects a summary that says
anything else (a headline changed to PASS with only its SHA256SUMS line rewritten).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from harness.evidence import markdown as md
from harness.evidence.ending import RERUN_PREFIX, ending_lines
from harness.evidence.schema import Ranks, Receipt

RECEIPT_SHA_LINE = "receipt.json sha256: `{}`"
_RECEIPT_SHA = re.compile(r"^receipt\.json sha256: `([0-9a-f]{64})`$", re.MULTILINE)


def receipt_sha256_in(summary: str) -> str | None:
    """The receipt sha256 a summary names, or None."""
    found = _RECEIPT_SHA.findall(summary)
    return found[0] if len(found) == 1 else None


def rerun_bundle_in(summary: str) -> Path | None:
    """The bundle path the summary's rerun line names (the folder it was written in), or
    None when it has no such line."""
    for line in summary.splitlines():
        if line.startswith(RERUN_PREFIX):
            words = _split(line[len(RERUN_PREFIX) :])
            if len(words) == 4 and words[:3] == ["dcpqual", "run", "--rerun-failed"]:
                return Path(words[3])
    return None


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return []


def summary_differences(stated: str, receipt: Receipt, receipt_sha256: str) -> str | None:
    """Where a summary.md differs from the one this receipt renders, as one phrase, or None."""
    expected = render_summary(receipt, receipt_sha256, bundle=rerun_bundle_in(stated))
    if stated == expected:
        return None
    mine, theirs = stated.splitlines(), expected.splitlines()
    for number, (a, b) in enumerate(zip(mine, theirs, strict=False), start=1):
        if a != b:
            return f"line {number} is {_clip(a)!r} where the receipt renders {_clip(b)!r}"
    if len(mine) != len(theirs):
        return f"it has {len(mine)} lines where the receipt renders {len(theirs)}"
    return "its line endings or final newline differ from what the receipt renders"


def _clip(line: str) -> str:
    return line if len(line) <= 100 else line[:97] + "..."


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


def _engine_lines(r: Receipt) -> list[str]:
    """The engine lane in a few lines (receipt.json holds the whole of `models.engine`)."""
    lane = r.models.engine
    if lane is None:
        return []
    lines = ["", "## Engine lane", ""]
    for engine in lane.engines:
        lines.append(
            f"- {md.text(engine.get('model'))}: vLLM {md.text(engine.get('vllm_version'))} "
            f"({md.code(engine.get('vllm_path'))}, commit {md.text(engine.get('vllm_commit'))}), "
            f"TP{engine.get('tp')}/DCP{engine.get('dcp')}, cudagraph "
            f"{md.text(engine.get('cudagraph_mode'))} sizes {md.text(engine.get('capture_sizes'))}"
            f", KV {md.text(engine.get('kv_cache_dtype'))}, graphs {md.text(engine.get('graphs'))}"
        )
    served = ", ".join(f"{p} {n}" for p, n in lane.b12x_calls.items()) or "none"
    lines.append(
        f"- vLLM's own warm ran: {_yes(lane.warm_ran)}; its capture ran: {_yes(lane.capture_ran)}"
        f"; lazy events: **{lane.lazy_events}**; controls caught {lane.controls_caught}/"
        f"{lane.controls}"
    )
    lines.append(
        f"- DCP calls served by b12x: {md.text(served)}; by another path: {lane.other_calls}; "
        f"tokens equal across ranks: {_yes(lane.tokens_agree)}, equal to enforce_eager: "
        f"{_yes(lane.eager_equal)}"
    )
    return lines


def render_summary(receipt: Receipt, receipt_sha256: str, bundle: Path | None = None) -> str:
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
                f"Python {env.python}, host {env.host}"
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

    lines += _engine_lines(r)

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
