"""The smoke's evidence bundle: the same receipt schema and writer as `dcpqual run`.

The smoke leaves what one rank of a run leaves (`records/rank-00.json`, `junit/rank-00.xml`),
plus `smoke/result.json` (everything the smoke saw), and hands the folder to the evidence
writer, so verdict, status, tallies, capture and negative-control counts, limitations and
SHA256SUMS follow the project's one set of rules and `dcpqual verify` checks the bundle.

Each check is one test of the suite "smoke": the capture (`test_capture[kimi-k3]`, failed with
every reason `CaptureOutcome.problems` gives) and one control per required detector
(`test_control[<detector>]`). Capture windows become capture records: the capture as an
ordinary window, each control that ran as a negative-control window expecting its detector.
The receipt's verdict therefore fails exactly when the smoke's own verdict does.
"""

from __future__ import annotations

import io
import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from junitparser import Failure, JUnitXml, TestCase, TestSuite

from harness.atomic import atomic_write_bytes
from harness.evidence.junit import mangle
from harness.evidence.run_context import RunContext
from harness.evidence.writer import finalize_bundle
from harness.schema.capture import CaptureRecord
from harness.schema.layout import RECORDS_DIR, SMOKE_RESULT_NAME
from harness.schema.rank_record import (
    RankFacts,
    RankRecord,
    TestOutcome,
    junit_path,
    rank_record_path,
)
from harness.schema.receipt import Receipt, RunExtra
from harness.schema.smoke import (
    CAPTURE_TEST,
    CONTROL_WORK,
    REQUIRED_CONTROLS,
    SMOKE_MODEL,
    Smoke,
    SmokeResult,
    control_test,
    smoke_tests,
)
from harness.smoke.step import PRODUCTION_DCP, PRODUCTION_TP

RESULT_NAME = SMOKE_RESULT_NAME  # verify holds a smoke's receipt to it
# The torch the nox sessions and CI pin (noxfile.TORCH_PIN; pyproject allows a range); the
# smoke runs on whatever is installed.
PINNED_TORCH = "2.13.0"


def smoke_captures(result: SmokeResult) -> tuple[CaptureRecord, ...]:
    """The capture window, then one negative-control window per control that ran."""
    capture = result.capture
    records = [
        CaptureRecord(
            test=CAPTURE_TEST,
            model=capture.model,
            rank=0,
            path=capture.path,
            warm_impl=result.extra.warm_impl,
            signatures=capture.signatures,
            events=capture.events,
            detectors=capture.statuses,
            replays=capture.replays if not capture.mismatches else 0,
        )
    ]
    for control in result.controls:
        if not control.ran:
            continue
        records.append(
            CaptureRecord(
                test=control_test(control.detector),
                model=SMOKE_MODEL if control.detector == "transport-registry" else "none",
                rank=0,
                path=control.path,
                warm_impl="before-kimi" if control.detector == "transport-registry" else "none",
                events=control.events,
                negative_control=True,
                expected_detectors=(control.detector,),
                detectors=control.statuses,
            )
        )
    return tuple(records)


def smoke_limitations(result: SmokeResult) -> dict[str, str]:
    """What the smoke could not show, beyond what the evidence rules derive themselves."""
    machine = result.machine
    found = ", ".join(s.describe() for s in result.discovered) or "none"
    made = ", ".join(s.describe() for s in result.warmed) or "none"
    out = {  # the "smoke" limitation itself is the evidence rules' (`rules.SMOKE_LIMITATION`)
        "world-1": (
            f"one process on one device (world 1): the stand-in {SMOKE_MODEL} was built at "
            f"TP{PRODUCTION_TP}/DCP{PRODUCTION_DCP} and warmed by the vendored warm code, whose "
            f"signatures ({found}) were created as their world-1 projections ({made}); the "
            "query gather and output reduction ran as one-rank collectives, so no data crossed "
            "ranks and no multi-rank communicator was built"
        ),
        "b12x-sm12x": (
            f"the device is {machine.device_name} ({machine.sm}); b12x's kernels need sm_12x "
            + (
                "and b12x is not installed"
                if machine.b12x is None
                else f"and b12x {machine.b12x} was not used"
            )
            + ", so the b12x transport and its kernel-resolution guard did not run"
        ),
        "controls": (
            "each control was shown to fire with every detector on ("
            + "; ".join(f"{d}: {CONTROL_WORK[d]}" for d in REQUIRED_CONTROLS)
            + "); that each depends on its own detector (a run with it removed) is shown by "
            "the CPU suites only"
        ),
    }
    if machine.torch.split("+")[0] != PINNED_TORCH:
        out["torch"] = (
            f"torch {machine.torch} (CUDA {machine.cuda or 'none'}) as installed on this "
            f"machine, not the pinned {PINNED_TORCH}; the smoke enforces no pin"
        )
    return out


def rank_record(result: SmokeResult, tests: Sequence[TestOutcome]) -> RankRecord:
    return RankRecord(
        rank=0,
        world_size=1,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        backend=result.machine.backend,
        device=result.machine.device,
        warm_impl=result.extra.warm_impl,
        started_at=result.started_at,
        finished_at=result.finished_at,
        complete=True,
        collected=tuple(t.nodeid for t in tests),
        tests=tuple(tests),
        captures=smoke_captures(result),
        extra=RankFacts(transports=result.extra.transports),
    )


def junit_report(tests: Sequence[TestOutcome]) -> bytes:
    """The JUnit report pytest's --junitxml would write for these outcomes."""
    suite = TestSuite("pytest")
    for test in tests:
        classname, name = mangle(test.nodeid)
        case = TestCase(name=name, classname=classname, time=round(test.duration_s, 3))
        if test.outcome == "failed":
            case.result = [Failure(test.message or "failed")]
        suite.add_testcase(case)
    suite.update_statistics()
    xml = JUnitXml()
    xml.add_testsuite(suite)
    buf = io.BytesIO()
    xml.write(buf)
    return buf.getvalue()


def write_smoke_bundle(out_dir: Path, result: SmokeResult, *, command: Sequence[str]) -> Receipt:
    """Write the bundle into `out_dir` (which must exist and be empty); returns the receipt."""
    tests = smoke_tests(result)
    record = rank_record(result, tests)
    record.write(rank_record_path(out_dir / RECORDS_DIR, 0))
    atomic_write_bytes(junit_path(out_dir, 0), junit_report(tests))
    text = json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(out_dir / RESULT_NAME, text.encode())
    context = RunContext(
        world_size=1,
        nproc_per_node=1,
        backend=result.machine.backend,
        tp=1,
        dcp=1,
        warm_impl=record.warm_impl,
        command=tuple(command),
        started_at=result.started_at,
        finished_at=result.finished_at,
        extra=RunExtra(smoke=Smoke(machine=result.machine, failures=result.failures)),
        limitations=smoke_limitations(result),
    )
    return finalize_bundle(out_dir, context)
