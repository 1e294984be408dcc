"""Synthetic out folders, as the launcher leaves them, for the evidence tests.

Records are written with the real `RankRecord.write`, JUnit reports in the shape pytest's
--junitxml gives (xunit2: classname = dotted module path [+ class], no file attribute).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

import pytest

from harness.capture.check import DETECTOR_NAMES
from harness.capture.events import LazyEvent
from harness.core.signature import TransportSignature
from harness.evidence import writer
from harness.evidence.hashprobe import probe_hash
from harness.evidence.junit import mangle
from harness.evidence.run_context import RunContext, TorchrunFailure
from harness.schema.capture import CaptureRecord, DetectorStatus, SignatureUse
from harness.schema.image import Image
from harness.schema.rank_record import (
    Provenance,
    RankRecord,
    RankStart,
    TestOutcome,
    rank_record_path,
)
from harness.schema.receipt import Environment, Gpu, Launch, Receipt, RunExtra, Source

CAPTURE_TEST = "suites/capture/test_capture.py::test_no_lazy_work[kimi-k3]"
CONTROL_TEST = "suites/capture/test_capture.py::test_negative_control"
COMBINE_TEST = "suites/transport/test_combine.py::TestCombine::test_matches_reference"
SIGNATURE_TEST = "suites/warm/test_signatures.py::test_kimi_signatures"
NODES = (SIGNATURE_TEST, COMBINE_TEST, CAPTURE_TEST, CONTROL_TEST)

KIMI = TransportSignature(
    dtype="bf16", total_heads=16, query_head_dim=576, output_head_dim=512, dcp_world_size=4
)
UNWARMED = TransportSignature(
    dtype="bf16", total_heads=8, query_head_dim=512, output_head_dim=512, dcp_world_size=4
)


def passed(nodeid: str) -> TestOutcome:
    return TestOutcome(nodeid=nodeid, outcome="passed", duration_s=0.25)


def failed(
    nodeid: str, message: str, *, primary: bool = True, by: Sequence[int] = ()
) -> TestOutcome:
    return TestOutcome(
        nodeid=nodeid, outcome="failed", message=message, primary=primary, failing_ranks=tuple(by)
    )


def capture(
    rank: int,
    *,
    events: Iterable[LazyEvent] = (),
    warmed: bool = True,
    path: str = "cpu-simulated",
    detectors: Iterable[DetectorStatus] = (),
    replays: int = 2,
) -> CaptureRecord:
    return CaptureRecord(
        test=CAPTURE_TEST,
        model="kimi-k3",
        rank=rank,
        path=path,
        warm_impl="vendored",
        signatures=(SignatureUse("kimi-k3", KIMI, warmed=warmed, used_in_capture=True),),
        events=tuple(events),
        detectors=tuple(detectors),
        replays=replays,
    )


def control(
    rank: int, *, detected: bool = True, detectors: Iterable[DetectorStatus] = ()
) -> CaptureRecord:
    events = ()
    if detected:
        events = (LazyEvent("transport-registry", rank, "created transport", UNWARMED),)
    return CaptureRecord(
        test=CONTROL_TEST,
        model="deepseek-v4",
        rank=rank,
        path="cpu-simulated",
        warm_impl="vendored",
        signatures=(SignatureUse("deepseek-v4", UNWARMED, warmed=False, used_in_capture=True),),
        events=events,
        negative_control=True,
        expected_detectors=("transport-registry",),
        detectors=tuple(detectors),
    )


def real_tree(rank: int, model: str = "kimi-k3") -> dict[str, object]:
    """One of vLLM's own trees as a rank records it, with one shim and the builder's lines."""
    return {
        "model": model,
        "tp": 2,
        "dcp": 2,
        "kv_cache_dtype": "auto",
        "dcp_comm_backend": "ag_rs",
        "classes": ["vllm.models.kimi_k3.nvidia.mla.MultiHeadLatentAttention"],
        "shims": ["cuda-stream-objects"],
        "limitations": [
            {"key": "real-trees", "text": f"{model} built from vLLM's own classes"},
            {"key": "real-tree shim cuda-stream-objects", "text": "torch.cuda streams faked"},
        ],
        "build_s": 1.0 + rank,
        "import_s": 10.0,
        "peak_rss_mib": 800.0 + rank,
    }


def junit_xml(outcomes: Iterable[TestOutcome], hostname: str = "node0") -> str:
    """A report shaped like pytest's --junitxml output for these outcomes."""
    cases = []
    counts = {"failed": 0, "error": 0, "skipped": 0}
    outcomes = list(outcomes)
    for outcome in outcomes:
        classname, name = mangle(outcome.nodeid)
        head = f'<testcase classname={quoteattr(classname)} name={quoteattr(name)} time="0.25"'
        msg = quoteattr(outcome.message or "")
        if outcome.outcome == "passed":
            cases.append(head + " />")
            continue
        counts[outcome.outcome] += 1
        tag = {"failed": "failure", "error": "error", "skipped": "skipped"}[outcome.outcome]
        cases.append(f"{head}><{tag} message={msg}>traceback here</{tag}></testcase>")
    return (
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        f'<testsuite name="pytest" errors="{counts["error"]}" failures="{counts["failed"]}" '
        f'skipped="{counts["skipped"]}" tests="{len(outcomes)}" time="1.0" '
        f'timestamp="2026-11-29T18:00:00" hostname="{hostname}">'
        + "".join(cases)
        + "</testsuite></testsuites>"
    )


def write_rank(
    out: Path,
    rank: int,
    world: int,
    *,
    tests: Sequence[TestOutcome] | None = None,
    captures: Sequence[CaptureRecord] | None = None,
    complete: bool = True,
    record: bool = True,
    junit: bool = True,
    transport: str = "torch-dist",
    collected: Sequence[str] = NODES,
    backend: str = "gloo",
    hostname: str = "node0",
    real_trees: Sequence[dict[str, object]] = (),
    provenance: Provenance | None = None,
    engine: dict[str, object] | None = None,
    start: RankStart | None = None,
    writes_junit: bool | None = None,
) -> None:
    """One rank's files: records/rank-NN.json and junit/rank-NN.xml (either may be left out);
    `real_trees`: vLLM's own trees the rank says it built (`real_tree`); `provenance`: the
    image and harness checkout it says it ran (None: a record that does not say); `start`: how
    it says it started (`drawn_seed_start`; None: a record that does not say); `writes_junit`:
    whether it says pytest's junitxml wrote its report (None: a record that does not say)."""
    tests = [passed(n) for n in NODES] if tests is None else list(tests)
    captures = [capture(rank), control(rank)] if captures is None else list(captures)
    if record:
        RankRecord(
            rank=rank,
            world_size=world,
            local_rank=rank,
            backend=backend,
            hostname=hostname,
            pid=1000 + rank,
            started_at="2026-11-29T18:00:00+00:00",
            finished_at="2026-11-29T18:01:00+00:00" if complete else None,
            complete=complete,
            collected=tuple(collected),
            tests=tuple(tests),
            captures=tuple(captures),
            extra={
                "transport": transport,
                "real_trees": list(real_trees),
                # A GPU run with b12x also ran the engine lane, as a qualifying run must.
                "engine": engine
                if engine is not None or backend != "nccl" or transport != "b12x"
                else engine_record(),
                **({} if writes_junit is None else {"junit": writes_junit}),
            },
            provenance=provenance,
            start=start,
        ).write(rank_record_path(out / "records", rank))
    if junit:
        path = out / "junit" / f"rank-{rank:02d}.xml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(junit_xml(tests))


def drawn_seed_start(seed: int = 1234) -> RankStart:
    """How a rank the launcher started with its drawn string-hash seed `seed` records its start
    (records of bundles written before the launcher fixed a seed state none)."""
    return RankStart(
        forked=False,
        hash_probe=probe_hash(seed),
        hash_seed_fixed=True,
        hash_seed=seed,
        hash_seed_drawn=True,
    )


def engine_record(**changes: object) -> dict[str, object]:
    """A rank's engine-lane record as a qualifying GPU run leaves it: vLLM's warm and capture
    ran, b12x served the decode DCP calls, no fallback, controls caught, tokens equal eager."""
    record: dict[str, object] = {
        "model": "kimi-k3",
        "architecture": "KimiLinearForCausalLM",
        "vllm_version": "0.32.0+fork",
        "vllm_path": "/opt/vllm/vllm",
        "vllm_commit": "ab" * 20,
        "tp": 16,
        "dcp": 16,
        "cudagraph_mode": "FULL_AND_PIECEWISE",
        "capture_sizes": [1, 2, 4, 8],
        "phases": [
            {"name": "warm", "entered": 1, "seconds": 1.0},
            {"name": "capture", "entered": 1, "seconds": 2.0},
            {"name": "decode", "entered": 2, "seconds": 0.5},
        ],
        "served": [
            {"path": "b12x:DcpAllToAllPool.all_gather_heads", "phase": "decode", "calls": 8}
        ],
        "controls": [
            {"action": "new-group", "where": "lazy-phase", "phase": "decode", "caught": True}
        ],
        "tokens": [[1, 2], [3, 4]],
        "eager_tokens": [[1, 2], [3, 4]],
    }
    record.update(changes)
    return record


def context(world: int = 4, **changes: object) -> RunContext:
    values: dict[str, object] = dict(
        world_size=world,
        nproc_per_node=world,
        tp=world,
        dcp=world,
        command=("torchrun", "--standalone", f"--nproc-per-node={world}", "-m", "pytest"),
        started_at="2026-11-29T18:00:00+00:00",
        finished_at="2026-11-29T18:01:00+00:00",
    )
    values.update(changes)
    if "extra" not in changes:  # as the launcher hands it over: with its record of the launch
        launched = {k: values[k] for k in ("exit_code", "timed_out") if k in values}
        values["extra"] = RunExtra(launch=Launch.model_validate(launched))
    return RunContext(**values)  # type: ignore[arg-type]


def torchrun_logs(out: Path, world: int, text: str = "") -> None:
    for rank in range(world):
        log = out / "torchrun" / "run-1" / "attempt_0" / str(rank) / "stdout.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"rank {rank} started\n{text}")


def passing_run(out: Path, world: int = 4) -> RunContext:
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        write_rank(out, rank, world)
    torchrun_logs(out, world)
    return context(world)


def failing_run(out: Path, world: int = 4, bad_rank: int = 2) -> RunContext:
    """`bad_rank` fails the combine test on its own; its peers fail it as a follow-on."""
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        tests = [passed(n) for n in NODES]
        if rank == bad_rank:
            tests[1] = failed(COMBINE_TEST, "AssertionError: combine mismatch at head 3")
        else:
            tests[1] = failed(COMBINE_TEST, "peer failed", primary=False, by=[bad_rank])
        write_rank(out, rank, world, tests=tests)
    torchrun_logs(out, world)
    return context(world, exit_code=1)


def write_partial_rank(out: Path, rank: int, world: int) -> None:
    """A rank that stopped in the capture test: the two tests before it passed, no capture, an
    incomplete record and no JUnit report."""
    write_rank(
        out,
        rank,
        world,
        tests=[passed(n) for n in NODES[:2]],
        captures=[],
        complete=False,
        junit=False,
    )


def killed_run(out: Path, world: int = 4, dead_rank: int = 1) -> RunContext:
    """`dead_rank` dies in the capture test: partial record, no JUnit report."""
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        if rank == dead_rank:
            write_partial_rank(out, rank, world)
        else:
            write_rank(out, rank, world)
    torchrun_logs(out, world)
    error = TorchrunFailure(
        rank=dead_rank,
        message="Signal 9 (SIGKILL) received by PID 1001",
        time=1764439200.0,
        file=f"torchrun/run-1/attempt_0/{dead_rank}/error.json",
    )
    (out / error.file).write_text(json.dumps(torchrun_error_file(error)))
    launch = Launch(exit_code=1, timed_out=False, leftovers=[4242])
    return context(world, exit_code=1, torchrun_error=error, extra=RunExtra(launch=launch))


def torchrun_error_file(error: TorchrunFailure) -> dict[str, object]:
    """torchrun's error file as the launcher reads `error` from it (and verify from the
    bundle): torch's format, with the rank's own note naming it."""
    note = {"rank": error.rank, "test": None, "message": error.message, "time": error.time}
    extra = {"timestamp": str(int(error.time)), "dcpqual": note}
    return {"message": {"message": error.message, "extraInfo": extra}}


def timed_out_run(out: Path, world: int = 4) -> RunContext:
    """Every rank hangs in the capture test until the run's timeout kills them all."""
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        write_partial_rank(out, rank, world)
        stack = out / "stacks" / f"rank-{rank:02d}.txt"
        stack.parent.mkdir(parents=True, exist_ok=True)
        stack.write_text('Thread 0x1 (most recent call first):\n  File "x.py", line 1\n')
    torchrun_logs(out, world)
    return context(world, exit_code=-9, timed_out=True)


def gpu_environment(hosts: Iterable[str] = (), **_: object) -> Environment:
    """What `capture_environment` finds on a host with four GPUs, for the ranks' `hosts`."""
    return Environment(
        torch="2.13.0",
        cuda="13.3",
        nccl="2.28.3",
        device_names=["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 4,
        python="3.11.7",
        host="gpu-node",
        hosts=sorted(set(hosts)),
        gpus=[Gpu(index=i, name="NVIDIA RTX PRO 6000", uuid=f"GPU-{i}") for i in range(4)],
        nvml=True,
    )


GPU_DIGEST = "sha256:" + "ab" * 32
LOCKED_IMAGE: dict[str, Any] = {
    "reference": "dcpqual/gpu16:1",
    "digest": GPU_DIGEST,
    "source_lock_sha256": "cd" * 32,
    "harness": {"dirty": False},
    "runtime": {"ok": True, "lock_sha256": "cd" * 32, "mismatches": []},
}
CLEAN_CHECKOUT = Source(version="0.1.0", commit="1" * 40, tree="2" * 40, dirty=False)
DIRTY_CHECKOUT = CLEAN_CHECKOUT.model_copy(
    update={"dirty": True, "dirty_paths": ["harness/evidence/rules.py"]}
)


def gpu_run(
    out: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    image: dict[str, Any] | None = LOCKED_IMAGE,
    transport: str = "b12x",
    controls: bool = True,
    detectors: Sequence[DetectorStatus] = (),
    harness: Source = CLEAN_CHECKOUT,
    junit: bool = True,
    tests: Sequence[TestOutcome] | None = None,
    window_detectors: Mapping[int, Sequence[DetectorStatus]] | None = None,
    control_detectors: Sequence[DetectorStatus] = (),
) -> Receipt:
    """The bundle of a passing 4-rank NCCL run on GPUs whose every capture window was a CUDA
    graph; by default it is all `qualified` asks for, each keyword takes one thing away
    (`junit` False: rank 3 left no JUnit report; `tests`: every rank's outcomes, e.g. a skip).
    `detectors`: what every capture window lists (none: records from before windows listed
    theirs), `window_detectors` the lists of some ranks' windows instead, `control_detectors`
    what the negative controls list."""
    monkeypatch.setattr(writer, "capture_environment", gpu_environment)
    monkeypatch.setattr(writer, "capture_sources", lambda: {"dcpqual": harness})
    out.mkdir()
    for rank in range(4):
        listed = (window_detectors or {}).get(rank, detectors)
        caps = [capture(rank, path="cuda-graph", detectors=listed)]
        if controls:
            caps.append(control(rank, detectors=control_detectors))
        write_rank(
            out,
            rank,
            4,
            tests=tests,
            captures=caps,
            transport=transport,
            backend="nccl",
            junit=junit or rank != 3,
        )
    identity = None if image is None else Image.model_validate(image)
    return writer.finalize_bundle(out, context(4, backend="nccl", image=identity))


# Every detector of a window, each watching it (a GPU run's list, with all of them active).
WATCHED = tuple(DetectorStatus(name, active=True) for name in DETECTOR_NAMES)


def watched_but(*names: str) -> tuple[DetectorStatus, ...]:
    """`WATCHED` without the detectors `names`: a list trimmed of them."""
    return tuple(s for s in WATCHED if s.name not in names)


# gpu_run keywords that each take one thing `qualified` needs away, and the limitation the
# receipt must then admit (which also keeps it `source-qualified`)
DENIALS = [
    pytest.param({"transport": "torch-dist"}, "b12x-transport", id="no-b12x"),
    pytest.param({"controls": False}, "negative-control", id="no-negative-control"),
    pytest.param(
        {"detectors": (DetectorStatus("cuda-memory", active=False, reason="NVML is missing"),)},
        "detectors",
        id="inactive-detector",
    ),
    pytest.param({"harness": DIRTY_CHECKOUT}, "sources", id="dirty-checkout"),
    pytest.param({"harness": Source(version="0.1.0")}, "sources", id="not-a-checkout"),
    pytest.param({"junit": False}, "ranks", id="lost-junit"),
    pytest.param({"image": None}, "image", id="no-image"),
]
