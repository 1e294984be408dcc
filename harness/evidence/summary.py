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
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from harness.evidence import markdown as md
from harness.evidence.short_summary import RERUN_PREFIX, ending_lines, first_line, not_run_count
from harness.schema.base import Limitation
from harness.schema.receipt import Capture, Ranks, Receipt

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
    """Where a summary.md differs from the one this receipt renders, as one phrase, or None.
    A receipt written before `skip_reasons` renders the layout of then (`summary_v1`)."""
    bundle = rerun_bundle_in(stated)
    expected = render_summary(receipt, receipt_sha256, bundle=bundle)
    if receipt.skip_reasons is None:  # written before: one of the layouts of then
        from harness.evidence import summary_v1

        then = [
            summary_v1.render_summary(receipt, receipt_sha256, bundle, with_host=host)
            for host in (False, True)
        ]
        expected = stated if stated in then else then[0]
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


def _list(numbers: Sequence[int]) -> str:
    """0, 2 and 3 (prose, not a list repr)."""
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


_LIST_REPR = re.compile(r"(?<![\w\]])\[(\d+(?:, \d+)*)?\]")


def prose(text: str) -> str:
    """A receipt's text with its list reprs read as prose: `ranks [0, 2, 3]` -> `ranks 0, 2
    and 3`, `[]` -> `none` (the receipt keeps the text the rules give)."""

    def words(match: re.Match[str]) -> str:
        if not match[1]:
            return "none"
        return _list([int(n) for n in match[1].split(", ")])

    return _LIST_REPR.sub(words, text)


def _ranks_line(ranks: Ranks) -> str:
    line = f"{ranks.complete}/{ranks.expected} complete"
    if ranks.killed:
        line += f"; did not finish: {_list(ranks.killed)}"
    if ranks.stopped:
        line += f" (stopped by the run's fault: {_list(ranks.stopped)})"
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


# The geometry dcpqual qualifies for: Kimi-K3 served at TP16 / DCP16 on 16 ranks.
TARGET_MODEL, TARGET_TP, TARGET_DCP, TARGET_WORLD = "Kimi-K3", 16, 16, 16

# "What did not run", grouped, each group's keys in order of weight (what a reviewer must weigh
# first); keys not named here come last in the last group.
_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Left out of this run",
        ("test-bodies", "skipped", "selection", "ranks", "negative-control", "smoke"),
    ),
    (
        "Not run on this machine",
        (
            "engine",
            "engine-capture",
            "engine-dcp",
            "engine-seams",
            "gpu-capture",
            "nccl",
            "b12x-transport",
            "image",
            "detectors",
            "gpu-facts",
        ),
    ),
    (
        "Shims and stand-ins",
        ("real-trees", "real-decode", "engine-model", "engine-shims", "warm-impl"),
    ),
    ("Out of scope", ("multi-node", "sources", "hash-seed")),
)
# Limitations that concern the dcpqual suites (their transports, trees, warm code, capture
# windows): a custom suite's summary leaves them to receipt.json.
_SUITES_ONLY = frozenset(
    {
        "b12x-transport",
        "real-trees",
        "real-decode",
        "warm-impl",
        "engine",
        "negative-control",
        "gpu-capture",
        "detectors",
        "selection",
    }
)


def custom_suite(receipt: Receipt) -> bool:
    """The run's targets are none of the dcpqual suites (a suites/ folder or what is in it)."""
    targets = receipt.selection.targets if receipt.selection is not None else []
    return bool(targets) and not any("suites" in Path(t.split("::", 1)[0]).parts for t in targets)


def _geometry_scope(r: Receipt) -> str:
    g = r.geometry
    ran = (
        f"{g.world_size} ranks ({g.nnodes} node x {g.nproc_per_node}), {g.backend}, "
        f"TP{g.tp} / DCP{g.dcp}"
    )
    target = f"{TARGET_MODEL} TP{TARGET_TP} / DCP{TARGET_DCP} on {TARGET_WORLD} ranks"
    if (g.tp, g.dcp, g.world_size) == (TARGET_TP, TARGET_DCP, TARGET_WORLD):
        return f"{ran}: the target geometry ({target})"
    return f"{ran}: **not the target geometry** ({target})"


def _totals(r: Receipt) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for tally in r.suites.values():
        counts["passed"] += tally.passed
        counts["failed"] += tally.failed
        counts["errors"] += tally.errors
        counts["skipped"] += tally.skipped
    return counts


def _tests_scope(r: Receipt) -> str:
    t = _totals(r)
    not_run = not_run_count(r)
    selected = t["passed"] + t["failed"] + t["errors"] + t["skipped"] + not_run
    ran = t["passed"] + t["failed"] + t["errors"]
    line = f"{selected} selected, {ran} ran ({t['passed']} passed"
    line += f", {t['failed']} failed" if t["failed"] else ""
    line += f", {t['errors']} error{'s' if t['errors'] != 1 else ''}" if t["errors"] else ""
    line += f"), {t['skipped']} skipped"
    if not_run > 0:
        maxfail = r.run.extra.options.maxfail if r.run.extra.options is not None else 0
        stopped = t["failed"] + t["errors"]
        why = (
            f"stopped after {stopped} failure{'s' if stopped != 1 else ''} (--maxfail {maxfail})"
            if maxfail and stopped >= maxfail
            else "the run ended before they ran"
        )
        line += f", {not_run} not run: {why}"
    return line


def _skips(r: Receipt) -> list[str]:
    if not r.skip_reasons:
        return []
    # Most frequent first, then by reason: the same order whatever order the JSON kept.
    ordered = sorted(r.skip_reasons.items(), key=lambda item: (-item[1], item[0]))
    return [f"  - {n} x {md.text(reason)}" for reason, n in ordered]


def _narrowing(r: Receipt) -> str:
    from harness.evidence.rules import narrowing

    if r.selection is None:
        return "not recorded"
    if custom_suite(r):
        return "a custom suite: " + md.text(", ".join(r.selection.targets[:3]))
    said = narrowing(r.selection)
    return md.text("; ".join(said)) if said else "none: the whole suites/ folder"


def _verdict(r: Receipt) -> str:
    line = f"**{r.verdict.upper()}** ({r.status})"
    rc = r.root_cause
    if r.verdict == "fail" and rc is not None:
        where = "" if rc.rank is None else f"rank {rc.rank}: "
        line += f": {md.text(where + first_line(rc.message))} (root cause; more under Failures)"
    elif r.verdict == "fail" and r.failures:
        line += ": " + md.text(first_line(r.failures[0]))
    return line


def _scope(r: Receipt) -> list[str]:
    """The first screen: what was qualified, at what scope, with what verdict."""
    lines = [
        f"- **Qualified:** {_geometry_scope(r)}",
        f"- **Tests:** {_tests_scope(r)}",
        *(["- **Skipped, by reason:**", *_skips(r)] if r.skip_reasons else []),
        f"- **Narrowing:** {_narrowing(r)}",
        f"- **Verdict:** {_verdict(r)}",
    ]
    return [*lines, ""]


def _lazy_table(c: Capture) -> list[str]:
    """Lazy events as a rank x detector table (16 ranks alike are one glance, not 16 bullets)."""
    if not c.events:
        return []
    detectors = sorted({e.detector for e in c.events})
    ranks = sorted({e.rank for e in c.events})
    counts = Counter((e.rank, e.detector) for e in c.events)
    rows: list[list[object]] = [
        [rank, *(counts.get((rank, d), 0) or "" for d in detectors)] for rank in ranks
    ]
    lines = ["", f"Lazy events during capture ({c.lazy_events}), by rank and detector:", ""]
    lines += _table(["rank", *(md.text(d) for d in detectors)], rows)
    if len(c.events) < c.lazy_events:
        lines.append(f"({len(c.events)} of {c.lazy_events} events listed in receipt.json)")
    return lines


def _failures(r: Receipt) -> list[str]:
    if r.verdict != "fail":
        return []
    lines = ["## Failures", ""]
    rc = r.root_cause
    if rc is not None:
        where = "rank ?" if rc.rank is None else f"rank {rc.rank}"
        at = f", {md.code(rc.test)}" if rc.test else ""
        lines += [f"Root cause: {where}{at} ({rc.kind}):", "", *_fence(rc.message), ""]
    for failed in r.failed_tests:
        word = "failed" if failed.outcome == "failed" else "error"
        ranks = failed.ranks
        who = f"ranks {_list(ranks)}" if len(ranks) > 1 else _rank_word(ranks)
        lines.append(f"- {md.code(failed.nodeid)} {word} on {who}: {md.text(failed.message)}")
    lines += _lazy_table(r.capture)
    if r.failures:
        lines += ["", "Every reason the run failed:", ""]
        lines += [f"- {md.text(prose(first_line(reason)))}" for reason in r.failures]
    return [*lines, ""]


def _rank_word(ranks: Sequence[int]) -> str:
    return "rank ?" if not ranks else f"rank {ranks[0]}"


def _not_run(r: Receipt) -> list[str]:
    """What did not run, grouped and ordered by weight; a custom suite's summary leaves the
    suites' own limitations to receipt.json."""
    items = list(r.limitation_items or _items_of(r.limitations))
    custom = custom_suite(r)
    left_out = [i.key for i in items if custom and i.key in _SUITES_ONLY]
    items = [i for i in items if not (custom and i.key in _SUITES_ONLY)]
    order = {key: n for n, key in enumerate(k for _, keys in _GROUPS for k in keys)}
    items.sort(key=lambda i: order.get(i.key, len(order)))
    lines = ["## What did not run", ""]
    placed: set[str] = set()
    for n, (title, keys) in enumerate(_GROUPS):
        last = n == len(_GROUPS) - 1
        mine = [i for i in items if i.key in keys or (last and i.key not in placed)]
        mine = [i for i in mine if i.key not in placed]
        placed |= {i.key for i in mine}
        if mine:
            lines += [f"### {title}", ""]
            lines += [f"- {md.text(i.key)}: {md.text(prose(i.text))}" for i in mine]
            lines.append("")
    if not items:
        lines += ["- nothing", ""]
    if left_out:
        lines += [
            f"Not applicable to a custom suite (kept in receipt.json): {', '.join(left_out)}",
            "",
        ]
    return lines


def _items_of(lines: Sequence[str]) -> list[Limitation]:
    return [Limitation(key=k, text=t) for k, _, t in (ln.partition(": ") for ln in lines) if k]


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
    lines += _scope(r)
    lines += _ending(r, bundle)
    lines += _failures(r)
    lines += _not_run(r)
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
                f"Python {env.python}"
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
    lines += ["## Run", ""]
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
