"""Turn a finished run's out folder into an evidence bundle, and prepare that folder.

`finalize_bundle` is a pipeline of small steps: refuse to overwrite -> scrub secrets from what
the ranks and torchrun left -> derive the receipt's facts from the records and JUnit reports
(harness.evidence.derive, which verify runs again on the bundle) -> status and limitations ->
write junit/merged.xml, launch.json (the launcher's record of the launch), receipt.json,
summary.md -> write SHA256SUMS over every other file. Every write is atomic. A bundle is never
overwritten: a folder that already holds receipt.json or SHA256SUMS is refused before anything
is touched.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness import __version__
from harness.atomic import atomic_write_bytes
from harness.core.secrets import Scrubber, environment_scrubber
from harness.errors import UsageError
from harness.evidence import rules
from harness.evidence.derive import derive
from harness.evidence.environment import capture_environment
from harness.evidence.files import (
    UNREADABLE,
    hash_files,
    render_sums,
    sha256_bytes,
    unsafe_name,
    walk,
)
from harness.evidence.launch_record import launch_record_bytes
from harness.evidence.redact import ScrubReport, scrub_folder
from harness.evidence.run_context import RunContext
from harness.evidence.sources import capture_sources
from harness.evidence.summary import render_summary
from harness.schema.base import limitation_lines
from harness.schema.image import Image
from harness.schema.layout import (
    LAUNCH_NAME,
    MERGED_JUNIT,
    RECEIPT_NAME,
    RECORDS_DIR,
    SUMMARY_NAME,
    SUMS_NAME,
    rank_file_name,
)
from harness.schema.receipt import SCHEMA, Geometry, Receipt, Run, Scrub

# Files the receipt's `files` map cannot cover: itself, and what is written after it.
UNWITNESSED = frozenset({RECEIPT_NAME, SUMMARY_NAME, SUMS_NAME})


def default_out_dir(root: Path = Path("evidence")) -> Path:
    """`evidence/<UTC timestamp>-<short id>/` (not created)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return root / f"{stamp}-{uuid.uuid4().hex[:8]}"


# Out folders this process claimed: their open descriptors, each holding an exclusive flock
# for as long as this process runs (or until `release_out_dir`).
_CLAIMED: dict[Path, int] = {}


def prepare_out_dir(path: Path) -> Path:
    """Create the out folder for a run and claim it; refuse one that exists and is not empty,
    or that another run is claiming at the same moment.

    The claim is an exclusive lock on the folder itself, taken before it is looked into and
    held while this process runs: of two runs started at the same instant on one empty folder,
    one wins and the other is refused (checking, then writing, lets both in).
    Returns the absolute path. Nothing is touched when it refuses.
    """
    path = Path(path).absolute()
    try:
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise UsageError(f"evidence folder {path} exists and is not a folder")
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UsageError(
                f"evidence folder {path} is being used by another run; choose another --out"
            ) from None
        try:
            entries = sorted(p.name for p in path.iterdir())
            if entries:
                shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
                raise UsageError(
                    f"evidence folder {path} is not empty ({len(entries)} entries: {shown}); "
                    "evidence is never overwritten, choose another --out"
                )
            _probe_writable(path)
        except BaseException:
            os.close(fd)
            raise
    except OSError as exc:
        raise UsageError(
            f"cannot use {path} as the evidence folder: {exc.strerror or exc}"
        ) from None
    _CLAIMED[path] = fd
    return path


def take_out_dir(path: Path) -> bool:
    """Claim an existing out folder with the lock `prepare_out_dir` takes, without waiting;
    False while another process holds it. Node 0 of a multi-node run holds it for its whole
    run, so another node that gets it knows node 0's launcher is gone, on a folder whose locks
    every node shares (a local folder; a network file system may not carry them between
    hosts). Held like a prepared folder's claim, until `release_out_dir`."""
    path = Path(path).absolute()
    if path in _CLAIMED:
        return True
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    except BaseException:
        os.close(fd)
        raise
    _CLAIMED[path] = fd
    return True


def release_out_dir(path: Path) -> None:
    """Let go of an out folder this process claimed (its run is over)."""
    fd = _CLAIMED.pop(Path(path).absolute(), None)
    if fd is not None:
        os.close(fd)


def _probe_writable(path: Path) -> None:
    """Create and remove one file, so a read-only or immutable folder is refused up front."""
    fd, name = tempfile.mkstemp(prefix=".dcpqual-probe-", dir=path)
    os.close(fd)
    os.unlink(name)


def _check_no_bundle(out_dir: Path) -> None:
    if not out_dir.is_dir():
        raise UsageError(f"evidence folder {out_dir} does not exist or is not a folder")
    for name in (RECEIPT_NAME, SUMS_NAME):
        if (out_dir / name).exists() or (out_dir / name).is_symlink():
            raise UsageError(
                f"{out_dir / name} already exists: {out_dir} already holds a bundle, and a "
                "bundle is never overwritten"
            )


def _check_only_files(out_dir: Path) -> None:
    for entry in walk(out_dir):
        if entry.kind != "file":
            what = "unreadable" if entry.kind == UNREADABLE else f"a {entry.kind}"
            raise UsageError(f"{entry.path} is {what}, not a file; a bundle holds files")
        if unsafe_name(entry.relpath):
            raise UsageError(f"{entry.path!r}: a bundle cannot list a name with '\\' or newline")


def scrub_out_dir(out_dir: Path) -> ScrubReport:
    """Remove secrets from every file and name already in the folder; the first step of every
    ending, before anything else is written (links and special files are not read)."""
    return scrub_folder(Path(out_dir), environment_scrubber())


def scrub_receipt(receipt: Receipt, scrub: Scrubber) -> Receipt:
    """The receipt with secrets removed from its values, never from its structure.

    A field the schema fixes to a few words (a verdict, a status) cannot carry a secret beyond
    that word, so where scrubbing a value would make the receipt invalid, the value is kept.
    """
    data = receipt.model_dump(mode="json", by_alias=True)
    clean, hits = scrub.value(data)
    if not hits:
        return receipt
    try:
        return Receipt.model_validate(clean)
    except ValidationError as exc:
        for error in exc.errors():
            _restore(clean, data, error["loc"])
    return Receipt.model_validate(clean)


def _restore(clean: Any, original: Any, loc: tuple[int | str, ...]) -> None:
    for step in loc[:-1]:
        clean, original = clean[step], original[step]
    clean[loc[-1]] = original[loc[-1]]


def finalize_bundle(out_dir: Path, ctx: RunContext) -> Receipt:
    """Write receipt.json, junit/merged.xml, summary.md and SHA256SUMS into `out_dir`.

    Reads `records/rank-NN.json`, `junit/rank-NN.xml`, `torchrun/` and `stacks/` as the launcher
    left them; keeps every one of those files (scrubbed of secret values) in the bundle.
    """
    out_dir = Path(out_dir)
    _check_no_bundle(out_dir)
    geometry, image = _validated(ctx)  # before anything is touched
    scrub = environment_scrubber()
    first = scrub_folder(out_dir, scrub)  # before anything else is read or written
    ctx = _with_scrub_losses(ctx, first)
    _check_only_files(out_dir)
    earlier = () if ctx.extra.scrub is None else ctx.extra.scrub.changed
    scrubbed = [*first.changed, *earlier]

    receipt, merged_xml = assemble_receipt(out_dir, ctx, geometry, image)

    merged_xml, hits = scrub.xml_bytes(merged_xml)
    if hits:
        scrubbed.append(MERGED_JUNIT)
    # Messages, commands and paths in the receipt may carry a secret too: scrub its values
    # before its launch record is made, so launch.json is the receipt's copy exactly.
    receipt = scrub_receipt(receipt, scrub)
    pending = {MERGED_JUNIT: merged_xml}
    if receipt.run.extra.launch is not None:
        pending[LAUNCH_NAME] = launch_record_bytes(receipt.run.extra.launch)
    # The receipt first, witnessing the files still to come by the bytes they will hold: on a
    # full disk the small receipt, which says how the run ended, is what must exist.
    witnessed = [
        e.relpath
        for e in walk(out_dir)
        if e.relpath not in UNWITNESSED and e.relpath not in pending
    ]
    files = hash_files(out_dir, witnessed)
    files.update({name: sha256_bytes(data) for name, data in pending.items()})
    receipt = receipt.model_copy(
        update={"scrubbed_files": sorted(set(scrubbed)), "files": dict(sorted(files.items()))}
    )
    receipt_bytes = receipt.dumps().encode("utf-8")
    atomic_write_bytes(out_dir / RECEIPT_NAME, receipt_bytes)
    for name, data in pending.items():
        atomic_write_bytes(out_dir / name, data)

    # Rendered only from scrubbed values (the receipt, the folder's name) and never scrubbed as
    # text afterwards: the template's own words are no secret (a secret "complete" must not
    # rewrite "2/2 complete"), and verify renders it again byte for byte.
    shown, _ = scrub.text(str(out_dir.absolute()))
    text = render_summary(receipt, sha256_bytes(receipt_bytes), bundle=Path(shown))
    atomic_write_bytes(out_dir / SUMMARY_NAME, text.encode())

    listed = [e.relpath for e in walk(out_dir) if e.relpath != SUMS_NAME]
    atomic_write_bytes(out_dir / SUMS_NAME, render_sums(hash_files(out_dir, listed)).encode())
    return receipt


def _with_scrub_losses(ctx: RunContext, report: ScrubReport) -> RunContext:
    """The run's scrub record with what this scrub rewrote in place or removed added (the
    launcher's scrub ran first; the failure rules read `removed` from the run)."""
    if not report.in_place and not report.removed:
        return ctx
    earlier = ctx.extra.scrub or Scrub()
    scrub = earlier.model_copy(
        update={
            "in_place": sorted({*earlier.in_place, *report.in_place}),
            "removed": sorted({*earlier.removed, *report.removed}),
        }
    )
    return replace(ctx, extra=ctx.extra.model_copy(update={"scrub": scrub}))


def assemble_receipt(
    out_dir: Path, ctx: RunContext, geometry: Geometry, image: Image | None
) -> tuple[Receipt, bytes]:
    """The receipt (without its `files` witness) and merged JUnit bytes; writes nothing."""
    captured = capture_sources()
    harness = captured.get("dcpqual")
    facts = derive(
        out_dir,
        geometry,
        _launched(ctx),
        warm_impl=ctx.warm_impl,
        image=image,
        torchrun_error=ctx.torchrun_error,
        harness_version=None if harness is None else harness.version,
    )
    environment = capture_environment(hosts=facts.hosts)
    sources = captured if facts.harness is None else {**captured, "dcpqual": facts.harness}
    required = rules.required_limitations(
        geometry=facts.geometry,
        image=facts.image,
        capture=facts.capture,
        negative_control=facts.negative_control,
        transports=facts.transports,
        ranks=facts.ranks,
        sources=sources,
        selection=facts.selection,
        models=facts.models,
        warm_impl=facts.warm_impl,
        zygote=None if ctx.extra.launch is None else ctx.extra.launch.zygote,
        nodes=ctx.extra.nodes,
        hash_seeds=facts.hash_seeds,
        coverage=facts.coverage,
        smoke=ctx.extra.smoke is not None,
        suites=facts.suites,
        node_zero_gone=ctx.extra.node_zero_gone,
    )
    limitation_items = rules.render_limitations(
        required,
        rules.advisory_limitations(
            backend=facts.geometry.backend,
            nvml=environment.nvml,
            notes=[*facts.merged.notes, *_unreadable_notes(facts.rank_files.unreadable)],
        ),
        dict(ctx.limitations),
    )
    receipt = Receipt(
        schema=SCHEMA,
        verdict=facts.verdict,
        status=rules.status_of(facts.verdict, environment, required),
        geometry=facts.geometry,
        environment=environment,
        image=facts.image,
        sources=sources,
        suites=facts.suites,
        skip_reasons=facts.skip_reasons,
        signatures=facts.signatures,
        capture=facts.capture,
        negative_control=facts.negative_control,
        root_cause=facts.root_cause,
        limitations=limitation_lines(limitation_items),
        limitation_items=limitation_items,
        failures=facts.failures,
        failed_tests=facts.failed_tests,
        selection=facts.selection,
        warm_impl=facts.warm_impl,
        transports=facts.transports,
        models=facts.models,
        ranks=facts.ranks,
        hash_seeds=facts.hash_seeds,
        coverage=facts.coverage,
        run=facts.receipt_run,
        generated_by=f"dcpqual {__version__}",
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    return receipt, facts.merged.xml


def _launched(ctx: RunContext) -> Run:
    """How the launcher started the run and saw it end (no rank file records this): the exit
    code and timeout from its record of the launch where it left one, by the rule verify holds
    them to."""
    exit_code, timed_out = ctx.exit_code, ctx.timed_out
    if ctx.extra.launch is not None:
        exit_code, timed_out = rules.launched_outcome(ctx.extra.launch, ctx.extra.nodes)
    return Run(
        command=list(ctx.command),
        pytest_args=list(ctx.pytest_args),
        exit_code=exit_code,
        timed_out=timed_out,
        started_at=ctx.started_at,
        finished_at=ctx.finished_at,
        extra=ctx.extra,
    )


def _validated(ctx: RunContext) -> tuple[Geometry, Image | None]:
    """The run's geometry and image as receipt values; a launcher bug becomes a usage error."""
    try:
        geometry = Geometry.model_validate(  # backend: a str here, a Literal in the receipt
            {
                "world_size": ctx.world_size,
                "nnodes": ctx.nnodes,
                "nproc_per_node": ctx.nproc_per_node,
                "backend": ctx.backend,
                "tp": ctx.tp,
                "dcp": ctx.dcp,
            }
        )
        image = ctx.image
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'geometry'}: {e['msg']}" for e in exc.errors()
        )
        raise UsageError(f"cannot write a receipt for this run: {problems}") from None
    return geometry, image


def _unreadable_notes(unreadable: dict[int, str]) -> list[str]:
    return [
        f"{RECORDS_DIR}/{rank_file_name(r, '.json')} is unreadable: {why}"
        for r, why in unreadable.items()
    ]
