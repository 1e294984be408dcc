"""Source gates: the fork's and b12x's own focused tests for this path, run inside the image.

`python -m harness.image.gates --where cpu|gpu --out FILE [--lock FILE] [--root DIR]`

The lock's `source_gates` say which tests of which component run where: `cpu` gates run in the
image build (everywhere), `gpu` gates on the GPU node before the suites. Each gate runs pytest on
its test ids in the component's tree as the image keeps it (`<root>/<component>/tests`) and its
tallies are written to FILE (a JSON list of `GateTally`), which the in-image check reads into
the receipt (`image.runtime.observed.source_gates`). Exit 1 when any gate did not run and pass
(a gate that ran no test did not pass), so a failure fails the build or the run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.errors import DcpqualError
from harness.schema.image import GateTally
from harness.schema.lock import SourceGate

DEFAULT_ROOT = Path("/opt/dcpqual/image/gates")
# In a GPU container: where the GPU gates' report goes (HOME is writable for the run's user; the
# image root is not) and the variable that tells the in-image check to read it.
GPU_REPORT = "/tmp/dcpqual-home/source-gates-gpu.json"
GPU_REPORT_ENV = "DCPQUAL_GPU_GATES"

Runner = Callable[[Sequence[str], Path], int]


def gate_argv(gate: SourceGate, junit: Path) -> list[str]:
    """The pytest command one gate runs (in its component's tree)."""
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        *gate.tests,
    ]


def tallies(junit: Path) -> tuple[int, int, int, int]:
    """(passed, failed, skipped, errors) from a pytest JUnit XML file."""
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = failed = skipped = errors = 0
    for suite in suites:
        tests += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0))
        skipped += int(suite.get("skipped", 0))
        errors += int(suite.get("errors", 0))
    return tests - failed - skipped - errors, failed, skipped, errors


def gated(command: Sequence[str], report: str = GPU_REPORT) -> tuple[str, ...]:
    """`command` (a `dcpqual run` in a GPU container) after the GPU source gates: the run reads
    their report into the receipt (`GPU_REPORT_ENV`), and the exit status is the run's unless
    it passed and a gate failed, so a failed gate fails the run either way."""
    script = (
        f"python -m harness.image.gates --where gpu --out {shlex.quote(report)}; g=$?; "
        f"{GPU_REPORT_ENV}={shlex.quote(report)} {shlex.join(command)}; r=$?; "
        'if [ "$r" -ne 0 ]; then exit "$r"; fi; exit "$g"'
    )
    return ("sh", "-c", script)


def _run(argv: Sequence[str], cwd: Path) -> int:
    return subprocess.run(list(argv), cwd=cwd, check=False).returncode


def run_gate(gate: SourceGate, root: Path, run: Runner = _run) -> GateTally:
    tree = root / gate.component
    base = GateTally(component=gate.component, where=gate.where, tests=list(gate.tests), ran=False)
    if not (tree / "tests").is_dir():
        return base.model_copy(update={"note": f"no tests of {gate.component} in the image"})
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        code = run(gate_argv(gate, junit), tree)
        if not junit.is_file():
            return base.model_copy(
                update={"exit_code": code, "note": f"pytest wrote no report (exit {code})"}
            )
        passed, failed, skipped, errors = tallies(junit)
    return base.model_copy(
        update={
            "ran": True,
            "exit_code": code,
            "passed": passed,
            "failed": failed,
            "skipped": skipped,
            "errors": errors,
        }
    )


def run_gates(
    gates: Sequence[SourceGate], where: str, root: Path, run: Runner = _run
) -> list[GateTally]:
    return [run_gate(g, root, run) for g in gates if g.where == where]


def main(argv: Sequence[str] | None = None) -> int:
    from harness.image.lock import load_lock
    from harness.image.verify_runtime import default_lock_path

    parser = argparse.ArgumentParser(prog="python -m harness.image.gates")
    parser.add_argument("--where", required=True, choices=("cpu", "gpu"))
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--lock", type=Path, default=None)
    parser.add_argument("--root", type=Path, default=None)
    args = parser.parse_args(argv)
    root = args.root or Path(os.environ.get("DCPQUAL_GATES_ROOT") or DEFAULT_ROOT)
    try:
        lock = load_lock(args.lock or default_lock_path())
    except DcpqualError as exc:
        print(f"gates: error: {exc}", file=sys.stderr)
        return exc.exit_code
    results = run_gates(lock.source_gates, args.where, root)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps([r.model_dump(mode="json") for r in results], indent=2, sort_keys=True) + "\n"
    )
    bad = [r for r in results if not r.ok]
    for r in results:
        state = "ok" if r.ok else "FAILED"
        print(
            f"gates: {r.key}: {state}: {r.passed} passed, {r.failed} failed, {r.skipped} "
            f"skipped, {r.errors} errors{f' ({r.note})' if r.note else ''}",
            file=sys.stderr,
        )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
