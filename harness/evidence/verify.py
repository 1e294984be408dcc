"""`dcpqual verify DIR`: is this bundle intact, well-formed and honest with itself?

Four layers, each problem one line that starts with the file it is about:
1. Files: every file hashes to its `SHA256SUMS` entry; nothing is missing or extra. Each file but
   receipt.json, summary.md and SHA256SUMS has a second witness (the receipt's `files` map), and
   receipt.json has one in summary.md, so an edited file and an edited SHA256SUMS line are told
   apart. summary.md has only SHA256SUMS: an edit there names both. Every file SHA256SUMS lists
   is in the receipt's `files` map and the reverse (but for the three files that map cannot
   cover), so a file added to both the folder and SHA256SUMS is caught.
2. Schema: receipt.json validates as "dcpqual-receipt/v1", each value of its own JSON type (a
   count is a number, not `true` or "1").
3. Consistency: records/ and junit/ hold rank files only of the world's ranks; tallies equal
   junit/merged.xml, and what a test reporter reads there (each
   testcase's own result element, each suite's counts) equals the per-rank outcomes the
   tallies count (harness.evidence.junit.reader_problems); the run's exit code and timeout
   follow from the launcher's record of the launch, which every launcher run has and which
   equals the bundle's launch.json and, with several nodes, every node's marker
   (harness.evidence.launch_record);
   an exit code of 0 is refused while the bundle holds a rank's torchrun error file (the ranks
   write those themselves, on a failure that fails their exit status and so torchrun's); an
   interrupted run's root cause is its interruption, and only an interrupted run's; a bundle
   node 1 wrote because node 0 was gone (`run.extra.node_zero_gone`) fails, names node 0's
   death as its root cause unless interrupted first, and keeps node 0's unfinished marker; the
   `node-0` limitation is named exactly when that fact is there; verdict,
   status and root cause follow from the receipt's own facts, and the required limitations
   from those facts with the coverage the rank records give (harness.evidence.rules); every
   file under `strays/` is a stray the receipt names as moved there, and the reverse
   (harness.evidence.strays). That catches a receipt that drops a stray but keeps its file, or
   a file that is deleted but still named; a stray deleted from strays/ together with its
   entry, a removed stray (links, special files: no file was ever kept) dropped from the
   receipt, or a dropped `run.extra.scrub.removed` entry leaves nothing to hold the receipt
   to: only a signature catches those.
4. Re-derivation: no rank's own JUnit report counts a test better than its rank record does (a
   skip as a pass, a failure as anything else); merged.xml's every rank case (outcome, message,
   source) is what the rank reports merge to; the receipt's verdict, failures, ranks, tallies,
   skip reasons, coverage, capture, negative control, signatures, transports, selection, real
   trees, hosts, harness checkout, failed tests, rootdir and root cause equal what the writer's
   own derivation (harness.evidence.derive) gives from the hash-covered rank records and JUnit
   reports, its geometry, warm code and image digest agree with those records by that
   derivation's own check, and (bundles of the earlier fork server) its zygotes agree with them
   too (harness.evidence.rederive),
   naming the first field that differs; and summary.md is exactly what the receipt renders
   (harness.evidence.summary).

JSON is read bounded and strict (harness.jsonfile): a receipt that is a FIFO, a device, huge or
nested too deep stops verify with one line and exit 2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from harness.errors import UsageError
from harness.evidence import rules
from harness.evidence.files import UNREADABLE, parse_sums, sha256_file, walk
from harness.evidence.junit import read_merged, reader_problems, skip_reasons, tallies
from harness.evidence.launch_record import launch_record_problems
from harness.evidence.rederive import derive_stated, first_difference, rederive_problems
from harness.evidence.strays import strays_problems
from harness.evidence.summary import receipt_sha256_in, summary_differences
from harness.evidence.writer import UNWITNESSED
from harness.jsonfile import JsonSyntaxError, read_json
from harness.schema.layout import (
    JUNIT_DIR,
    MERGED_JUNIT,
    RECEIPT_NAME,
    RECORDS_DIR,
    SUMMARY_NAME,
    SUMS_NAME,
    TORCHRUN_DIR,
    rank_file_name,
)
from harness.schema.rank_record import error_file_note
from harness.schema.receipt import SCHEMA, Coverage, Receipt, RootCause, Tally

REQUIRED = (RECEIPT_NAME, SUMMARY_NAME, MERGED_JUNIT, SUMS_NAME)
ERROR_FILE_NAME = "error.json"  # torchrun's name for a rank's TORCHELASTIC_ERROR_FILE


@dataclass(frozen=True)
class VerifyResult:
    bundle: Path
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_bundle(bundle: Path) -> VerifyResult:
    """Check a bundle; raises UsageError only when `bundle` is not a folder at all."""
    bundle = Path(bundle)
    if not bundle.exists():
        raise UsageError(f"{bundle} does not exist")
    if not bundle.is_dir():
        raise UsageError(f"{bundle} is not a folder")
    problems: list[str] = []
    try:
        receipt_data = _load_json(bundle / RECEIPT_NAME, problems)
        receipt = _validate(receipt_data, problems)
        problems += _check_files(bundle, receipt, receipt_data)
        if receipt is not None:
            derived = derive_stated(bundle, receipt)  # the records, read once
            problems += _check_consistency(bundle, receipt, derived.coverage)
            problems += strays_problems(bundle, receipt)
            problems += rederive_problems(bundle, receipt, derived)
            problems += _check_summary(bundle, receipt)
    except OSError as exc:  # a file or folder its mode keeps from us: the checks stop there
        problems.append(
            f"{_relative(bundle, exc.filename)}: {_unreadable(exc)}, so the checks "
            "that need it were not made"
        )
    return VerifyResult(bundle, tuple(problems))


def _relative(bundle: Path, filename: object) -> str:
    if not isinstance(filename, str):
        return str(bundle)
    path = Path(filename)
    return path.relative_to(bundle).as_posix() if path.is_relative_to(bundle) else filename


def _unreadable(exc: OSError) -> str:
    return f"cannot be read ({exc.strerror or exc})"


def _load_json(path: Path, problems: list[str]) -> object:
    if not path.is_file() or path.is_symlink():
        return None  # reported by the file check
    try:
        return read_json(path)
    except JsonSyntaxError as exc:
        problems.append(f"{RECEIPT_NAME}: not valid JSON: {exc}")
        return None


def _validate(data: object | None, problems: list[str]) -> Receipt | None:
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        problems.append(f"{RECEIPT_NAME}: schema is {found!r}, expected {SCHEMA!r}")
        return None
    try:
        receipt = Receipt.model_validate(data)
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "(top)"
            problems.append(f"{RECEIPT_NAME}: schema: {where}: {error['msg']}")
        return None
    retyped = _retyped(data, receipt.to_json(), "")
    if retyped is not None:
        where, stated, read = retyped
        problems.append(
            f"{RECEIPT_NAME}: schema: {where}: a JSON {stated} where the receipt holds a {read}"
        )
        return None
    return receipt


def _json_kind(value: object) -> str:
    """What a reader of the JSON takes a value for (a number written 2 or 2.0 alike)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _retyped(stated: object, read: object, where: str) -> tuple[str, str, str] | None:
    """The first value of the receipt's JSON (`stated`) of another JSON type than the one
    pydantic read it as (`read`, the validated receipt's JSON), as (where, stated kind, read
    kind): pydantic reads `true` or "1" as a count of 1, which a reader of the JSON (jq's
    `.failed > 0`) does not. Keys the JSON leaves out (defaults of older receipts) are skipped."""
    if isinstance(stated, dict) and isinstance(read, dict):
        for key, value in stated.items():
            if key in read and (found := _retyped(value, read[key], f"{where}.{key}")):
                return found
        return None
    if isinstance(stated, list) and isinstance(read, list):
        for index, (a, b) in enumerate(zip(stated, read, strict=False)):
            if found := _retyped(a, b, f"{where}[{index}]"):
                return found
        return None
    kinds = _json_kind(stated), _json_kind(read)
    return None if kinds[0] == kinds[1] else (where.lstrip(".") or "(top)", *kinds)


def _witnesses(bundle: Path, receipt: Receipt | None, data: object | None) -> dict[str, str]:
    """Second opinions on file hashes: the receipt's `files`, summary.md's receipt hash."""
    witness: dict[str, str] = {}
    if receipt is not None:
        witness.update(receipt.files)
    elif isinstance(data, dict) and isinstance(data.get("files"), dict):
        witness.update({k: v for k, v in data["files"].items() if isinstance(v, str)})
    summary = bundle / SUMMARY_NAME
    if summary.is_file():
        named = receipt_sha256_in(summary.read_text(encoding="utf-8", errors="replace"))
        if named:
            witness[RECEIPT_NAME] = named
    return witness


def _check_files(bundle: Path, receipt: Receipt | None, data: object | None) -> list[str]:
    problems: list[str] = []
    entries = {e.relpath: e for e in walk(bundle)}
    for rel, entry in entries.items():
        if entry.kind == UNREADABLE:
            problems.append(
                f"{rel}: unreadable (a folder that cannot be listed, or inside one that cannot "
                "be entered), so it was not checked"
            )
        elif entry.kind != "file":
            problems.append(f"{rel}: is a {entry.kind}, not a file")
    for rel in REQUIRED:
        if rel not in entries:
            problems.append(f"{rel}: missing")
    sums_path = bundle / SUMS_NAME
    if SUMS_NAME not in entries or entries[SUMS_NAME].kind != "file":
        return problems
    try:
        parsed = parse_sums(sums_path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        return [*problems, f"{SUMS_NAME}: not UTF-8 text"]
    problems += [f"{SUMS_NAME}: {p}" for p in parsed.problems]
    listed = parsed.entries
    actual: dict[str, str] = {}
    unread: set[str] = set()
    for rel, e in entries.items():
        if e.kind != "file" or rel == SUMS_NAME:
            continue
        try:
            actual[rel] = sha256_file(e.path)
        except OSError as exc:
            problems.append(f"{rel}: {_unreadable(exc)}, so it was not checked")
            unread.add(rel)
    witness = _witnesses(bundle, receipt, data)
    witnessed = receipt is not None
    for rel in sorted((set(listed) | set(actual)) - unread):
        problem = _judge(rel, listed.get(rel), actual.get(rel), witness.get(rel), witnessed)
        if problem and not (problem.endswith(": missing") and rel in REQUIRED):
            problems.append(problem)
    if receipt is not None:
        for rel in sorted(set(receipt.files) - set(listed) - set(actual)):
            problems.append(f"{rel}: missing (listed in {RECEIPT_NAME} files)")
        problems += _check_file_lists(set(listed), set(receipt.files))
    return problems


def _check_file_lists(listed: set[str], witnessed: set[str]) -> list[str]:
    """SHA256SUMS and the receipt's `files` must name the same files (see the docstring)."""
    problems = []
    for rel in sorted(listed - witnessed - set(UNWITNESSED)):
        problems.append(f"{SUMS_NAME}: lists {rel}, which {RECEIPT_NAME} files does not name")
    for rel in sorted(witnessed - listed):
        problems.append(f"{RECEIPT_NAME}: files names {rel}, which {SUMS_NAME} does not list")
    for rel in sorted(witnessed & set(UNWITNESSED)):
        problems.append(f"{RECEIPT_NAME}: files names {rel}, which it cannot cover")
    return problems


def _judge(
    rel: str, listed: str | None, actual: str | None, witness: str | None, witnessed: bool
) -> str | None:
    """One file's verdict from its SHA256SUMS entry, its real hash and its second witness.

    `witnessed` says the receipt's `files` map could be read, so a file it does not name was
    never part of the bundle.
    """
    if listed is not None and actual is None:
        if witnessed and witness is None and rel not in REQUIRED:
            return f"{SUMS_NAME}: lists {rel}, which is not in the bundle"
        return f"{rel}: missing"
    if listed is None:
        if witness == actual:
            return f"{SUMS_NAME}: does not list {rel} ({RECEIPT_NAME} does)"
        return f"{rel}: not listed in {SUMS_NAME} (added after the bundle was written?)"
    if listed == actual:
        if witness is not None and witness != actual:
            holder = SUMMARY_NAME if rel == RECEIPT_NAME else RECEIPT_NAME
            return (
                f"{holder}: names sha256 {witness[:12]}... for {rel}, which hashes {actual[:12]}..."
            )
        return None
    assert actual is not None, "a listed file that is missing returned above"
    if witness is None:
        return f"{rel}: does not match its {SUMS_NAME} entry ({rel} or {SUMS_NAME} was modified)"
    if witness == actual:
        return f"{SUMS_NAME}: the entry for {rel} was modified ({rel} matches its other witness)"
    return f"{rel}: modified (sha256 {actual[:12]}..., recorded {listed[:12]}...)"


def _check_consistency(bundle: Path, receipt: Receipt, coverage: Coverage) -> list[str]:
    """`coverage`: what the rank records say ran, which the required limitations follow."""
    problems: list[str] = []
    merged_path = bundle / MERGED_JUNIT
    if merged_path.is_file():
        try:
            cases = read_merged(merged_path)
        except ValueError as exc:
            problems.append(f"{MERGED_JUNIT}: {exc}")
        else:
            recount = tallies(cases, runner_cases=receipt.skip_reasons is None)
            for suite in sorted(set(recount) | set(receipt.suites)):
                mine, theirs = receipt.suites.get(suite), recount.get(suite)
                if mine != theirs:
                    problems.append(
                        f"{RECEIPT_NAME}: suites.{suite} is {_tally(mine)} but {MERGED_JUNIT} "
                        f"counts {_tally(theirs)}"
                    )
            skips = skip_reasons(cases)
            if receipt.skip_reasons is not None and receipt.skip_reasons != skips:
                problems.append(
                    f"{RECEIPT_NAME}: skip_reasons are {receipt.skip_reasons} but "
                    f"{MERGED_JUNIT} groups its skips as {skips}"
                )
            bad_ranks = sorted({c.rank for c in cases if c.rank >= receipt.geometry.world_size})
            if bad_ranks:
                problems.append(f"{MERGED_JUNIT}: cases of ranks {bad_ranks} beyond world size")
            problems += [f"{MERGED_JUNIT}: {p}" for p in reader_problems(merged_path)]

    problems += _check_rank_files(bundle, receipt)
    problems += launch_record_problems(bundle, receipt)
    problems += _check_launched(receipt)
    problems += _check_rank_error_files(bundle, receipt)
    problems += _check_interruption(receipt)
    problems += _check_node_zero_gone(receipt)
    reasons = rules.failure_reasons_of(receipt)
    verdict = rules.verdict_of(reasons)
    if receipt.verdict != verdict:
        why = "; ".join(reasons) or "nothing failed"
        problems.append(
            f"{RECEIPT_NAME}: verdict is {receipt.verdict} but its facts say {verdict} ({why})"
        )
    required = required_limitations_of(receipt, coverage=coverage)
    status = rules.status_of(receipt.verdict, receipt.environment, required)
    if receipt.status != status:
        digest = receipt.image.digest if receipt.image else None
        denied = rules.denying_limitations(required) if receipt.verdict == "pass" else []
        why = f" (limitations that deny qualified: {', '.join(denied)})" if denied else ""
        problems.append(
            f"{RECEIPT_NAME}: status {receipt.status} is not allowed here: a {receipt.verdict} "
            f"run on {receipt.geometry.backend}, {len(receipt.environment.gpus)} GPUs, image "
            f"digest {digest}, capture paths {receipt.capture.paths} is {status}{why}"
        )
    if (receipt.root_cause is None) != (receipt.verdict == "pass"):
        state = "missing" if receipt.root_cause is None else "present"
        problems.append(f"{RECEIPT_NAME}: root_cause is {state} for a {receipt.verdict} verdict")
    cause = receipt.root_cause
    if cause is not None and cause.rank is not None and cause.rank >= receipt.geometry.world_size:
        problems.append(
            f"{RECEIPT_NAME}: root_cause.rank {cause.rank} is outside world "
            f"size {receipt.geometry.world_size}"
        )
    if receipt.ranks.expected != receipt.geometry.world_size:
        problems.append(
            f"{RECEIPT_NAME}: ranks.expected {receipt.ranks.expected} != geometry.world_size "
            f"{receipt.geometry.world_size}"
        )
    for key in rules.missing_limitations(receipt.limitation_keys(), required):
        problems.append(f"{RECEIPT_NAME}: limitations do not name '{key}': {required[key]}")
    for key in rules.unfounded_limitations(receipt.limitation_keys(), required):
        problems.append(
            f"{RECEIPT_NAME}: limitation '{key}' is named, but {rules.FACT_ONLY[key]} that "
            "alone gives it is absent"
        )
    for key in rules.repeated_limitations(receipt.limitation_keys()):
        problems.append(f"{RECEIPT_NAME}: limitations name '{key}' more than once")
    for key in rules.misstated_limitations(_limitation_pairs(receipt), required):
        problems.append(
            f"{RECEIPT_NAME}: limitation '{key}' does not say what the receipt's facts give: "
            f"{required[key]}"
        )
    return problems


_RANK_FILE = re.compile(r"rank-(\d+)(\.json|\.xml)")


def _check_rank_files(bundle: Path, receipt: Receipt) -> list[str]:
    """A record or JUnit report (`records/rank-NN.json`, `junit/rank-NN.xml`) is of a rank of
    the world, named as the ranks name it: the derivation reads only those, so another (a rank
    2 of a 2-rank run, all passed) would be evidence nothing holds, which a test reporter that
    reads `junit/rank-*.xml` counts."""
    world = receipt.geometry.world_size
    problems = []
    for folder, suffix in ((RECORDS_DIR, ".json"), (JUNIT_DIR, ".xml")):
        root = bundle / folder
        if root.is_symlink() or not root.is_dir():
            continue  # a link is named by the file check; none is followed
        for entry in walk(root):
            found = _RANK_FILE.fullmatch(entry.relpath)
            if found is None or found[2] != suffix:
                continue
            rank = int(found[1])
            if rank >= world or entry.relpath != rank_file_name(rank, suffix):
                problems.append(
                    f"{folder}/{entry.relpath}: not the file of a rank of this {world}-rank run "
                    f"(its ranks' are {rank_file_name(0, suffix)} to "
                    f"{rank_file_name(world - 1, suffix)})"
                )
    return problems


def _check_launched(receipt: Receipt) -> list[str]:
    """`run.exit_code` and `run.timed_out` are what the launcher's record of its torchrun (and
    every node's marker) give; that record is held to launch.json and the node markers apart
    (harness.evidence.launch_record), and a smoke's receipt has none."""
    extra = receipt.run.extra
    if extra.launch is None:
        return []
    outcome = rules.launched_outcome(extra.launch, extra.nodes)
    where = "run.extra.launch" + (", run.extra.nodes" if extra.nodes else "")
    pairs = [
        ("exit_code", receipt.run.exit_code, outcome.exit_code),
        ("timed_out", receipt.run.timed_out, outcome.timed_out),
    ]
    return [
        f"{RECEIPT_NAME}: run.{name} is {stated} but the launcher's record of the launch "
        f"({where}) says {launched}"
        for name, stated, launched in pairs
        if stated != launched
    ]


def _check_rank_error_files(bundle: Path, receipt: Receipt) -> list[str]:
    """A rank's torchrun error file (`torchrun/**/error.json`, where torchrun points each
    rank's TORCHELASTIC_ERROR_FILE) that holds the rank's own note is written by the rank on a
    failure that also fails its exit status (harness.rank.rankfiles.write_error_file); torchrun
    restarts no rank, so it exits non-zero too. Such a file is a witness the launcher's record
    cannot speak for. A file without that note is not the rank's: a child process the rank
    started inherits the variable, and a test of a launcher that fails may leave torch's own
    format there while the rank passes."""
    if receipt.run.exit_code != 0:
        return []
    logs = bundle / TORCHRUN_DIR
    if logs.is_symlink() or not logs.is_dir():  # the file check names a link; none is followed
        return []
    found = [
        f"{TORCHRUN_DIR}/{e.relpath}"
        for e in walk(logs)
        if e.kind == "file"
        and e.path.name == ERROR_FILE_NAME
        and error_file_note(e.path) is not None
    ]
    if not found:
        return []
    return [
        f"{RECEIPT_NAME}: run.exit_code is 0 but the bundle holds {len(found)} rank error "
        f"file(s) of torchrun, the first {found[0]} (a rank writes one only when it "
        "fails, and then torchrun exits non-zero)"
    ]


def _check_interruption(receipt: Receipt) -> list[str]:
    """An interrupted run's root cause is its interruption, as the launcher's record of the
    launch names it (held to launch.json); a root cause of kind "interrupted" without that
    record could blame any rank or test (the records' own cause is re-derived regardless)."""
    cause, interrupted = receipt.root_cause, receipt.run.extra.interrupted
    if interrupted is None and receipt.run.extra.node_zero_gone is not None:
        return []  # the cause is the node's death (_check_node_zero_gone)
    if interrupted is None:
        if cause is not None and cause.kind == "interrupted":
            return [
                f"{RECEIPT_NAME}: root_cause.kind is 'interrupted' but the launcher's record of "
                "the launch (run.extra.launch.interrupted) names no interruption"
            ]
        return []
    if cause is None:
        return []  # an interrupted run fails: the verdict check reports a pass
    expected = RootCause(rank=None, test=None, message=interrupted.message(), kind="interrupted")
    found = first_difference("root_cause", cause.model_dump(), expected.model_dump())
    if found is None:
        return []
    return [
        f"{RECEIPT_NAME}: {found.field} is {found.stated!r} but the launcher's record of the "
        f"launch (run.extra.launch.interrupted) says {found.derived!r}"
    ]


def _check_node_zero_gone(receipt: Receipt) -> list[str]:
    """A bundle another node wrote because node 0 died: only a multi-node run has one, the
    writer is a node of it, node 0's marker in it never said finished (node 0 would have
    written the bundle itself), and its root cause is node 0's death unless an interruption
    came first; a cause of kind "node-gone" without that fact could blame anything."""
    gone, cause = receipt.run.extra.node_zero_gone, receipt.root_cause
    if gone is None:
        if cause is not None and cause.kind == "node-gone":
            return [
                f"{RECEIPT_NAME}: root_cause.kind is 'node-gone' but run.extra.node_zero_gone "
                "names no node 0 that was gone"
            ]
        return []
    nnodes = receipt.geometry.nnodes
    if gone.by_node >= nnodes:
        return [
            f"{RECEIPT_NAME}: run.extra.node_zero_gone.by_node is {gone.by_node}, not a node "
            f"of this {nnodes}-node run"
        ]
    problems = []
    zero = (receipt.run.extra.nodes or {}).get("0")
    if zero is not None and zero.state == "finished":
        problems.append(
            f"{RECEIPT_NAME}: run.extra.node_zero_gone, but node 0's marker says its torchrun "
            "finished (such a node 0 writes the bundle itself)"
        )
    if receipt.run.extra.interrupted is None and cause is not None:
        expected = RootCause(
            rank=None, test=None, message=rules.node_zero_gone_reason(gone), kind="node-gone"
        )
        found = first_difference("root_cause", cause.model_dump(), expected.model_dump())
        if found is not None:
            problems.append(
                f"{RECEIPT_NAME}: {found.field} is {found.stated!r} but "
                f"run.extra.node_zero_gone says {found.derived!r}"
            )
    return problems


def required_limitations_of(receipt: Receipt, coverage: Coverage | None = None) -> dict[str, str]:
    """The limitations the rules require of this receipt's facts, key -> text; `coverage`, when
    given, in place of the receipt's (verify gives the records' own, so a receipt that drops its
    coverage still owes the `skipped` limitation)."""
    launch = receipt.run.extra.launch
    required = rules.required_limitations(
        geometry=receipt.geometry,
        image=receipt.image,
        capture=receipt.capture,
        negative_control=receipt.negative_control,
        transports=receipt.transports,
        ranks=receipt.ranks,
        sources=receipt.sources,
        selection=receipt.selection,
        models=receipt.models,
        warm_impl=receipt.warm_impl,
        zygote=None if launch is None else launch.zygote,
        nodes=receipt.run.extra.nodes,
        hash_seeds=receipt.hash_seeds,
        coverage=receipt.coverage if coverage is None else coverage,
        smoke=receipt.run.extra.smoke is not None,
        suites=receipt.suites,
        node_zero_gone=receipt.run.extra.node_zero_gone,
    )
    if (
        receipt.skip_reasons is None
        and receipt.models.engine is None
        and receipt.status != "qualified"
    ):
        # Written before the engine lane existed (the layout without `skip_reasons`, no lane):
        # its `engine` limitation only denies `qualified`, which such a receipt does not claim.
        required.pop("engine", None)
    return required


def _limitation_pairs(receipt: Receipt) -> list[tuple[str, str]]:
    """(key, text) of each limitation, from the objects or, in older receipts, the lines."""
    if receipt.limitation_items is not None:
        return [(item.key, item.text) for item in receipt.limitation_items]
    return [(k, t) for k, _, t in (line.partition(": ") for line in receipt.limitations)]


def _check_summary(bundle: Path, receipt: Receipt) -> list[str]:
    """summary.md must be exactly what this receipt renders (the writer renders it only from
    the scrubbed receipt and the bundle path its rerun line names)."""
    path = bundle / SUMMARY_NAME
    if not path.is_file() or path.is_symlink():
        return []  # reported by the file check
    try:
        stated = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [f"{SUMMARY_NAME}: unreadable: {exc}"]
    where = summary_differences(stated, receipt, sha256_file(bundle / RECEIPT_NAME))
    if where is None:
        return []
    return [f"{SUMMARY_NAME}: not what {RECEIPT_NAME} renders: {where}"]


def _tally(t: Tally | None) -> str:
    if t is None:
        return "absent"
    data = t.model_dump()
    return "{" + ", ".join(f"{k} {v}" for k, v in data.items()) + "}"
