"""A forger with the project's own tools: edit a receipt, make it agree with itself, reseal.

Used to show that `dcpqual verify` catches an edited receipt by re-deriving it from the rank
records, not by a hash the forger could not recompute: after the edit, the verdict, failures,
status and root cause are recomputed with `harness.evidence.rules`, summary.md is rendered again
and SHA256SUMS rewritten, exactly as the writer does it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.evidence import rules, summary_v1
from harness.evidence.files import hash_files, render_sums, sha256_bytes, sha256_file, walk
from harness.evidence.launch_record import marker_path
from harness.evidence.summary import render_summary
from harness.evidence.verify import required_limitations_of
from harness.schema.base import Limitation
from harness.schema.launch import Launch, NodeState
from harness.schema.layout import LAUNCH_NAME, SUMS_NAME
from harness.schema.receipt import Receipt, RootCause

Edit = Callable[[dict[str, Any]], None]


def self_consistent(receipt: Receipt) -> Receipt:
    """The receipt with verdict, failures, status and root cause following from its facts."""
    reasons = rules.failure_reasons_of(receipt)
    verdict = rules.verdict_of(reasons)
    cause = receipt.root_cause
    if verdict == "pass":
        cause = None
    elif cause is None:
        cause = RootCause(rank=None, test=None, message=reasons[0], kind="run")
    status = rules.status_of(verdict, receipt.environment, required_limitations_of(receipt))
    return receipt.model_copy(
        update={"verdict": verdict, "failures": reasons, "status": status, "root_cause": cause}
    )


def reseal(bundle: Path) -> None:
    """summary.md (in the layout verify renders for it) and SHA256SUMS rewritten for whatever
    receipt.json now says."""
    receipt_bytes = (bundle / "receipt.json").read_bytes()
    receipt = Receipt.model_validate_json(receipt_bytes)
    digest = sha256_bytes(receipt_bytes)
    if receipt.skip_reasons is None:  # the layout of receipts written before skip reasons
        summary = summary_v1.render_summary(receipt, digest, bundle.absolute(), with_host=False)
    else:
        summary = render_summary(receipt, digest, bundle=bundle.absolute())
    (bundle / "summary.md").write_text(summary)
    listed = [e.relpath for e in walk(bundle) if e.relpath != SUMS_NAME]
    (bundle / SUMS_NAME).write_text(render_sums(hash_files(bundle, listed)))


def forge(bundle: Path, edit: Edit, *, launch_record: bool = False) -> Receipt:
    """Apply `edit` to receipt.json's JSON, make the receipt self-consistent and reseal.
    `launch_record`: write launch.json and the node markers again from the edited receipt too
    (as the writer and the nodes' launchers would have), so only the checks that do not read
    them can tell."""
    data = json.loads((bundle / "receipt.json").read_text())
    edit(data)
    if launch_record:
        _rewrite_launch_record(bundle, data)
    if data.get("limitation_items") is not None:  # the structured copy follows the edited lines
        items = [Limitation.parse(line) for line in data["limitations"]]
        data["limitation_items"] = [item.model_dump() for item in items]
    receipt = self_consistent(Receipt.model_validate(data))
    (bundle / "receipt.json").write_text(receipt.dumps())
    reseal(bundle)
    return receipt


def edit_records(bundle: Path, change: Edit) -> Receipt:
    """Every rank record's JSON changed by `change`, and the receipt's `files` following them
    (a forger who rewrites records leaves the receipt's hashes agreeing)."""
    paths = sorted((bundle / "records").glob("rank-*.json"))
    for path in paths:
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    def rehash(data: dict[str, Any]) -> None:
        for path in paths:
            data["files"][f"records/{path.name}"] = sha256_file(path)

    return forge(bundle, rehash)


def restate_limitations(data: dict[str, Any], *keys: str) -> None:
    """A careful forger's last step: the `keys` limitations say what the rules give for the
    edited receipt's facts (verify compares their text too, not only their keys)."""
    required = required_limitations_of(Receipt.model_validate(data))
    data["limitations"] = [
        f"{key}: {required[key]}" if key in keys and key in required else line
        for line in data["limitations"]
        for key in [line.partition(": ")[0]]
    ]


def _rewrite_launch_record(bundle: Path, data: dict[str, Any]) -> None:
    """launch.json and nodes/node-KK.json as the receipt's `run.extra` states them, and the
    receipt's `files` map following them."""
    extra = data["run"]["extra"]
    written = {LAUNCH_NAME: extra.get("launch")}
    for key, marker in (extra.get("nodes") or {}).items():
        written[marker_path(Path(), int(key)).as_posix()] = marker
    for name, value in written.items():
        path = bundle / name
        if value is None:
            path.unlink(missing_ok=True)
            data["files"].pop(name, None)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        model = Launch if name == LAUNCH_NAME else NodeState
        path.write_text(model.model_validate(value).model_dump_json(indent=2))
        data["files"][name] = sha256_file(path)
