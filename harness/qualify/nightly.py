"""`dcpqual nightly` (and `nox -s nightly`): image -> gpu16 -> verify -> compare.

The GPU run writes its bundle straight into a persistent archive folder under the dated name
`dcpqual gpu16` gives it (`<UTC time>-gpu16-<digest>`), so the archive is the nightly history and
the newest earlier bundle that still verifies is the baseline. Nothing in the archive is ever
written twice: the archive must exist (a missing mount must not look like a first night), and
the new bundle is the one folder that the run added.

Fails closed: a step that could not run (no engine, fewer than 16 GPUs) leaves no bundle and
the pipeline stops there with that step's exit code (2 for unusable set-ups).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from harness.atomic import atomic_write_text
from harness.errors import UsageError
from harness.qualify.compare import Verify, compare_bundles, load_bundle
from harness.qualify.report import render_markdown
from harness.schema.compare import NightlyResult

# Bundle folders that `dcpqual gpu16` names: UTC time first, so names sort by date.
BUNDLE_NAME = re.compile(r"^\d{8}T\d{6}Z-[A-Za-z0-9._-]+$")

Runner = Callable[[Sequence[str]], int]
Emit = Callable[[str], None]


def default_steps(archive: Path, no_image: bool = False) -> tuple[tuple[str, ...], ...]:
    """The commands run in order; each must exit 0 for the next to run."""
    harness = (sys.executable, "-m", "harness")
    gpu16 = (*harness, "gpu16", "--evidence-root", str(archive))
    if no_image:
        return ((*gpu16[:4], "--no-image", *gpu16[4:]),)
    return ((*harness, "image", "build"), gpu16)


def run_command(argv: Sequence[str]) -> int:
    return subprocess.run(list(argv), check=False).returncode


def bundles_in(archive: Path) -> list[Path]:
    """Dated bundle folders in the archive, oldest first."""
    return sorted(p for p in archive.iterdir() if p.is_dir() and BUNDLE_NAME.match(p.name))


def newest_valid(
    candidates: Sequence[Path], verify: Verify | None
) -> tuple[Path | None, tuple[str, ...]]:
    """The newest bundle that verifies, and a note for each newer one that did not."""
    skipped: list[str] = []
    for path in reversed(candidates):
        try:
            load_bundle(path, verify)
        except UsageError as exc:
            skipped.append(str(exc))
            continue
        return path, tuple(skipped)
    return None, tuple(skipped)


def run_nightly(
    archive: Path,
    steps: Sequence[Sequence[str]],
    *,
    run: Runner = run_command,
    verify: Verify | None = None,
    emit: Emit = print,
) -> NightlyResult:
    """Run the steps into `archive`, then verify the new bundle and compare with the last one."""
    archive = Path(archive)
    if not archive.is_dir():
        raise UsageError(f"archive folder {archive} does not exist; create it once on the host")
    before = bundles_in(archive)
    previous, skipped = newest_valid(before, verify)
    emit(f"nightly: archive {archive}, previous bundle: {previous or 'none'}")
    codes: list[int] = []
    for argv in steps:
        emit("nightly: $ " + " ".join(argv))
        codes.append(run(argv))
        if codes[-1]:
            break
    added = [p for p in bundles_in(archive) if p not in before]
    result = NightlyResult(
        archive=archive,
        bundle=None,
        previous=previous,
        step_exit_codes=tuple(codes),
        problems=(),
        skipped_previous=skipped,
    )
    if not added:
        why = f"step {len(codes)} exited {codes[-1]}" if codes and codes[-1] else "no step failed"
        return replace(result, problems=(f"no new bundle in {archive} ({why})",))
    if len(added) > 1:
        names = ", ".join(p.name for p in added)
        raise UsageError(f"more than one new bundle in {archive} ({names}); another writer?")
    result = replace(result, bundle=added[0])
    problems = [f"step {i + 1} exited {c}" for i, c in enumerate(codes) if c]
    try:
        head = load_bundle(added[0], verify)
    except UsageError as exc:
        return replace(result, problems=(*problems, str(exc)))
    if head.receipt.verdict != "pass":
        problems.append(f"verdict {head.receipt.verdict}")
    comparison = None
    if previous is not None:
        comparison = compare_bundles(load_bundle(previous, verify), head)
        problems += [f"regression against {previous.name}: {r}" for r in comparison.regressions]
    return replace(
        result, problems=tuple(problems), verdict=head.receipt.verdict, comparison=comparison
    )


def write_report(result: NightlyResult, report: Path) -> None:
    """nightly.json, compare.md/.json and a copy of the bundle, for upload as one artifact."""
    report.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        report / "nightly.json", json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n"
    )
    if result.comparison is not None:
        atomic_write_text(report / "compare.md", render_markdown(result.comparison))
        atomic_write_text(
            report / "compare.json",
            json.dumps(result.comparison.to_json(), indent=2, sort_keys=True) + "\n",
        )
    else:
        lines = [f"### dcpqual nightly: {result.bundle.name if result.bundle else 'no bundle'}"]
        lines += ["", *(f"- `{p}`" for p in result.problems or ("no earlier bundle to compare",))]
        atomic_write_text(report / "compare.md", "\n".join(lines) + "\n")
    if result.bundle is not None:
        shutil.copytree(result.bundle, report / result.bundle.name, symlinks=True)


def main_nightly(archive: Path, report: Path | None = None, no_image: bool = False) -> int:
    result = run_nightly(archive, default_steps(archive, no_image))
    if report is not None:
        write_report(result, report)
    for problem in result.problems:
        print(f"nightly: {problem}", file=sys.stderr)
    status = "ok" if result.exit_code == 0 else f"FAILED (exit {result.exit_code})"
    print(f"nightly: {status}; bundle {result.bundle or 'none'}")
    return result.exit_code
