"""`dcpqual compare BASE_DIR HEAD_DIR`: what changed between two evidence bundles.

Both bundles are verified first (`harness.evidence.verify`); a bundle that does not verify is
unusable input, never a comparison. The comparison itself works on receipts only
(`compare_receipts`), so it can be tested with synthetic receipts.

HEAD regresses against BASE, and the exit code is 1, when any of these holds:
- the verdict went from pass to fail, or the status word went down
  (qualified > source-qualified > not-qualified);
- a suite lost tests to failures or errors, or disappeared;
- a suite passed fewer tests for other reasons: passes that became skips or did not run (a
  smaller geometry skips what needs more ranks; nothing failed, yet less was shown);
- lazy work in capture grew for some (detector, signature);
- a signature is used in capture without warmup in HEAD but was not in BASE;
- negative-control windows went undetected that BASE detected.
Everything else that differs (identity, environment, image, skips) is reported, not judged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from harness.errors import UsageError
from harness.evidence.files import sha256_file
from harness.schema.compare import (
    Change,
    Comparison,
    Count,
    Side,
    SignatureDelta,
    SignatureUse,
    SuiteCounts,
    SuiteDelta,
)
from harness.schema.layout import RECEIPT_NAME, SUMS_NAME
from harness.schema.receipt import Receipt, SignatureRow, Tally

if TYPE_CHECKING:
    from harness.evidence.verify import VerifyResult

# How a bundle is verified before it is compared (`harness.evidence.verify.verify_bundle`).
Verify = Callable[[Path], "VerifyResult"]

STATUS_RANK = {"not-qualified": 0, "source-qualified": 1, "qualified": 2}
NO_SIGNATURE = "(none)"


@dataclass(frozen=True)
class Bundle:
    """A verified bundle: its receipt and the hashes a reviewer can quote."""

    path: Path
    receipt: Receipt
    receipt_sha256: str
    sums_sha256: str


def load_bundle(path: Path, verify: Verify | None = None) -> Bundle:
    """Verify a bundle and read its receipt; anything unusable is a UsageError (exit 2)."""
    if verify is None:
        from harness.evidence.verify import verify_bundle

        verify = verify_bundle
    path = Path(path)
    result = verify(path)  # raises UsageError when `path` is not a folder
    if result.problems:
        shown = "; ".join(result.problems[:3])
        more = f" (+{len(result.problems) - 3} more)" if len(result.problems) > 3 else ""
        raise UsageError(f"{path} is not a valid bundle: {shown}{more}")
    receipt_path = path / RECEIPT_NAME
    try:
        receipt = Receipt.model_validate_json(receipt_path.read_bytes())
    except (OSError, ValidationError) as exc:
        raise UsageError(f"{receipt_path}: unreadable receipt: {exc}") from None
    return Bundle(path, receipt, sha256_file(receipt_path), sha256_file(path / SUMS_NAME))


def describe_signature(row: SignatureRow) -> str:
    """TransportSignature.describe() of the row, the words lazy events name it by."""
    return row.transport_signature().describe()


def describe_geometry(receipt: Receipt) -> str:
    g = receipt.geometry
    return (
        f"{g.world_size} ranks ({g.nnodes} x {g.nproc_per_node}), {g.backend}, "
        f"tp={g.tp} dcp={g.dcp}"
    )


def _side(receipt: Receipt, path: str, receipt_sha256: str, sums_sha256: str) -> Side:
    rc = receipt.root_cause
    cause = None
    if rc is not None:
        where = ", ".join(
            p for p in (f"rank {rc.rank}" if rc.rank is not None else "", rc.test or "") if p
        )
        cause = f"{where}: {rc.message}" if where else rc.message
    return Side(
        path=path,
        receipt_sha256=receipt_sha256,
        sums_sha256=sums_sha256,
        verdict=receipt.verdict,
        status=receipt.status,
        warm_impl=receipt.warm_impl,
        geometry=describe_geometry(receipt),
        root_cause=cause,
    )


def _signatures(base: Receipt, head: Receipt) -> tuple[SignatureDelta, ...]:
    def table(r: Receipt) -> dict[tuple[str, str], SignatureUse]:
        return {
            (row.model, describe_signature(row)): SignatureUse(row.warmed, row.used_in_capture)
            for row in r.signatures
        }

    b, h = table(base), table(head)
    return tuple(
        SignatureDelta(model, sig, b.get((model, sig)), h.get((model, sig)))
        for model, sig in sorted(b.keys() | h.keys())
    )


def _lazy_counts(base: Receipt, head: Receipt) -> tuple[Count, ...]:
    def counts(r: Receipt) -> Counter[tuple[str, str]]:
        # The schema holds `events` to `lazy_events` and `by_detector`, so listing is counting.
        return Counter((e.detector, e.signature or NO_SIGNATURE) for e in r.capture.events)

    b, h = counts(base), counts(head)
    return tuple(
        Count(d, s, b.get((d, s), 0), h.get((d, s), 0)) for d, s in sorted(b.keys() | h.keys())
    )


def _counts(tally: Tally | None) -> SuiteCounts | None:
    if tally is None:
        return None
    return SuiteCounts(tally.passed, tally.failed, tally.skipped, tally.errors)


def _suites(base: Receipt, head: Receipt) -> tuple[SuiteDelta, ...]:
    names = sorted(base.suites.keys() | head.suites.keys())
    return tuple(
        SuiteDelta(n, _counts(base.suites.get(n)), _counts(head.suites.get(n))) for n in names
    )


def _flatten(value: Any, prefix: str, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for key in sorted(value):
            _flatten(value[key], f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list) and all(not isinstance(v, Mapping | list) for v in value):
        out[prefix] = ", ".join(str(v) for v in value)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _flatten(item, f"{prefix}[{i}]", out)
    elif value is not None:
        out[prefix] = str(value)


def identity_of(receipt: Receipt) -> dict[str, str]:
    """The fields that say what ran and where, flattened to 'environment.torch' style keys."""
    data = receipt.to_json()
    env = {k: v for k, v in data["environment"].items() if k not in ("env", "redacted")}
    out: dict[str, str] = {"warm_impl": receipt.warm_impl}
    _flatten(data["geometry"], "geometry", out)
    _flatten(env, "environment", out)
    _flatten(data["image"] or {}, "image", out)
    _flatten(data["sources"], "sources", out)
    _flatten(data.get("transports", []), "transports", out)
    return out


def _identity(base: Receipt, head: Receipt) -> tuple[Change, ...]:
    b, h = identity_of(base), identity_of(head)
    return tuple(
        Change(k, b.get(k), h.get(k)) for k in sorted(b.keys() | h.keys()) if b.get(k) != h.get(k)
    )


def _bad(t: SuiteCounts | None) -> int:
    return 0 if t is None else t.failed + t.errors


def _judge(
    base: Receipt,
    head: Receipt,
    signatures: Iterable[SignatureDelta],
    lazy: Iterable[Count],
    suites: Iterable[SuiteDelta],
) -> tuple[list[str], list[str], list[str]]:
    worse: list[str] = []
    better: list[str] = []
    notes: list[str] = []
    if base.verdict != head.verdict:
        (worse if head.verdict == "fail" else better).append(
            f"verdict {base.verdict} -> {head.verdict}"
        )
    if STATUS_RANK[head.status] != STATUS_RANK[base.status]:
        (worse if STATUS_RANK[head.status] < STATUS_RANK[base.status] else better).append(
            f"status {base.status} -> {head.status}"
        )
    for s in suites:
        if s.head is None:
            worse.append(f"suite {s.name}: missing in head")
        elif s.base is None:
            notes.append(f"suite {s.name}: new in head")
        if s.base is None or s.head is None:
            continue
        b, h = _bad(s.base), _bad(s.head)
        if b != h:
            (worse if h > b else better).append(f"suite {s.name}: failed+errors {b} -> {h}")
        unshown = (s.base.passed - s.head.passed) - max(0, h - b)
        if unshown > 0:
            worse.append(
                f"suite {s.name}: {unshown} passed test(s) no longer pass without failing "
                f"(skipped or not run): passed {s.base.passed} -> {s.head.passed}, skipped "
                f"{s.base.skipped} -> {s.head.skipped}"
            )
        if s.head.skipped != s.base.skipped:
            notes.append(f"suite {s.name}: skipped {s.base.skipped} -> {s.head.skipped}")
    for c in lazy:
        if c.head != c.base:
            (worse if c.head > c.base else better).append(
                f"lazy events in capture ({c.detector}, {c.signature}): {c.base} -> {c.head}"
            )
    for d in signatures:
        was = d.base is not None and d.base.lazy
        now = d.head is not None and d.head.lazy
        if now and not was:
            worse.append(f"{d.model} {d.signature}: used in capture but not warmed")
        elif was and not now:
            better.append(f"{d.model} {d.signature}: no longer created lazily in capture")
    b_missed, h_missed = _missed(base), _missed(head)
    if b_missed != h_missed:
        (worse if h_missed > b_missed else better).append(
            f"negative controls not detected {b_missed} -> {h_missed}"
        )
    bodiless = head.coverage.no_body if head.coverage is not None else 0
    if bodiless and better:
        # Fewer failures where test bodies never ran is no fix: nothing was shown to work.
        notes += [f"not an improvement ({bodiless} test bodies never ran): {b}" for b in better]
        better = []
    if bodiless > (base.coverage.no_body if base.coverage is not None else 0):
        worse.append(f"head ran no test body for {bodiless} test(s)")
    if base.geometry != head.geometry:
        notes.append(
            f"geometry differs ({describe_geometry(base)} vs {describe_geometry(head)}): "
            "counts are not like for like"
        )
    return worse, better, notes


def _missed(r: Receipt) -> int:
    return r.negative_control.expected - r.negative_control.detected


def compare_receipts(
    base: Receipt | Mapping[str, Any],
    head: Receipt | Mapping[str, Any],
    *,
    base_ref: tuple[str, str, str] = ("base", "", ""),
    head_ref: tuple[str, str, str] = ("head", "", ""),
) -> Comparison:
    """Compare two receipts. `*_ref` is (path, receipt sha256, SHA256SUMS sha256) for display."""
    b, h = _receipt(base, "base"), _receipt(head, "head")
    signatures = _signatures(b, h)
    lazy = _lazy_counts(b, h)
    suites = _suites(b, h)
    worse, better, notes = _judge(b, h, signatures, lazy, suites)
    return Comparison(
        base=_side(b, *base_ref),
        head=_side(h, *head_ref),
        signatures=signatures,
        lazy_events=lazy,
        suites=suites,
        identity=_identity(b, h),
        regressions=tuple(worse),
        improvements=tuple(better),
        notes=tuple(notes),
    )


def compare_bundles(base: Bundle, head: Bundle) -> Comparison:
    return compare_receipts(
        base.receipt,
        head.receipt,
        base_ref=(str(base.path), base.receipt_sha256, base.sums_sha256),
        head_ref=(str(head.path), head.receipt_sha256, head.sums_sha256),
    )


def _receipt(value: Receipt | Mapping[str, Any], which: str) -> Receipt:
    if isinstance(value, Receipt):
        return value
    try:
        return Receipt.model_validate(dict(value))
    except ValidationError as exc:
        raise UsageError(f"{which} receipt does not validate: {exc}") from None
