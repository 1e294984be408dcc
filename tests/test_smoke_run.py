"""The smoke's pipeline, run for real on CPU (gloo, simulated capture), in a spawned process
(the pytest worker never holds a process group).

On CPU the smoke must fail, and say exactly why: the capture and the controls did not run on a
CUDA graph, and the cuda-memory and triton-jit controls could not run at all. With fakes in
place of those two detectors and their controls (the only parts that need the hardware), every
control fires and the path is the only failure left. Warmed by the code from before the Kimi-K3
recognizer, the strict capture itself fails on the transport registry.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from harness.capture.check import default_detectors
from harness.capture.controls import NegativeControl, NewGroupControl
from harness.capture.detector import Detector
from harness.core.signature import TransportSignature
from harness.schema.signature import SignatureJson
from harness.smoke import run as smoke_run
from harness.smoke.run import SmokeConfig, indexed, run_smoke
from harness.smoke.step import SmokeLayer, SmokeStep

pytestmark = pytest.mark.slow

DEVICE_LEDGER: list[int] = []
JIT_LEDGER: list[int] = []


class LedgerDetector(Detector):
    """A stand-in for a GPU detector: reports, at stop, growth of a ledger its control writes."""

    ledger: list[int]

    def _install(self) -> None:
        self._before = len(self.ledger)

    def _uninstall(self) -> None:
        pass

    def _collect(self) -> None:
        if len(self.ledger) > self._before:
            self.report(f"fake {self.name}: ledger grew", stack="")


class FakeDeviceMemory(LedgerDetector):
    name = "cuda-memory"
    ledger = DEVICE_LEDGER


class FakeTritonJit(LedgerDetector):
    name = "triton-jit"
    ledger = JIT_LEDGER


class LedgerControl(NegativeControl):
    ledger: list[int]

    def provoke(self) -> None:
        self.ledger.append(1)

    def happened(self) -> int:
        return len(self.ledger)


class FakeAllocation(LedgerControl):
    detector = "cuda-memory"
    ledger = DEVICE_LEDGER


class FakeCompile(LedgerControl):
    detector = "triton-jit"
    ledger = JIT_LEDGER


def fake_gpu_detectors(registry: Any, device: torch.device) -> list[Detector]:
    kept = [
        d
        for d in default_detectors(registry, device=device)
        if d.name not in ("cuda-memory", "triton-jit")
    ]
    return [*kept, FakeDeviceMemory(), FakeTritonJit()]


def _child(_rank: int, out: str) -> None:
    from harness.evidence.verify import verify_bundle
    from harness.smoke.bundle import write_smoke_bundle

    fakes = {
        "cuda-memory": FakeAllocation,
        "triton-jit": FakeCompile,
        "process-groups": NewGroupControl,
    }
    results = {
        "cpu": run_smoke(SmokeConfig(device="cpu")),
        "faked": run_smoke(SmokeConfig(device="cpu"), detectors=fake_gpu_detectors, controls=fakes),
        "before-kimi": run_smoke(SmokeConfig(device="cpu", warm_impl="before-kimi")),
    }
    folder = Path(out) / "bundle"
    folder.mkdir()
    receipt = write_smoke_bundle(folder, results["faked"], command=["test"])
    data = {name: r.to_json() for name, r in results.items()}
    data["bundle"] = {
        "problems": list(verify_bundle(folder).problems),
        "verdict": receipt.verdict,
        "detected": receipt.negative_control.detected,
    }
    (Path(out) / "results.json").write_text(json.dumps(data))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("smoke-run")
    mp.spawn(_child, args=(str(out),), nprocs=1, join=True)
    return json.loads((out / "results.json").read_text())


def test_on_cpu_the_smoke_fails_naming_the_paths_that_need_a_gpu(runs: dict[str, Any]) -> None:
    cpu = runs["cpu"]
    failures = cpu["failures"]
    assert len(failures) == 5, failures
    assert failures[0] == "capture ran on the cpu-simulated path, not cuda-graph"
    assert failures[1].startswith("cuda-memory control did not run: cuda-memory cannot run here")
    assert failures[2].startswith("triton-jit control did not run")
    assert failures[3] == "process-groups control ran on the cpu-simulated path, not cuda-graph"
    assert failures[4] == "transport-registry control ran on the cpu-simulated path, not cuda-graph"


def test_the_capture_itself_is_clean_and_replays_match(runs: dict[str, Any]) -> None:
    capture = runs["cpu"]["capture"]
    assert capture["events"] == [] and capture["error"] == "" and capture["mismatches"] == []
    assert capture["replays"] == capture["expected_replays"] == 2
    (use,) = capture["signatures"]
    assert use["warmed"] and use["used_in_capture"]
    assert (use["signature"]["total_heads"], use["signature"]["dcp_world_size"]) == (96, 1)


def test_warmup_found_the_production_kimi_signature_and_made_its_world_1_form(
    runs: dict[str, Any],
) -> None:
    (found,) = [SignatureJson.read(s) for s in runs["cpu"]["discovered"]]
    (made,) = [SignatureJson.read(s) for s in runs["cpu"]["warmed"]]
    assert found.describe() == "96 heads x 576 -> 512 (bf16, dcp=16, max_tokens=8, cpu)"
    assert made.describe() == "96 heads x 576 -> 512 (bf16, dcp=1, max_tokens=8, cpu)"


def test_the_controls_that_run_on_cpu_fire_in_the_capture(runs: dict[str, Any]) -> None:
    controls = {c["detector"]: c for c in runs["cpu"]["controls"]}
    for name in ("process-groups", "transport-registry"):
        control = controls[name]
        assert control["ran"] and control["happened"] >= 1
        assert [(e["detector"], e["phase"]) for e in control["events"]][:1] == [(name, "capture")]
    assert "LazySpecializationError" in controls["transport-registry"]["error"]
    assert "96 heads x 576 -> 512" in controls["transport-registry"]["error"]


def test_with_the_gpu_detectors_faked_only_the_path_is_left(runs: dict[str, Any]) -> None:
    failures = runs["faked"]["failures"]
    assert len(failures) == 5 and all("cpu-simulated path, not cuda-graph" in f for f in failures)
    assert runs["bundle"] == {"problems": [], "verdict": "fail", "detected": 4}


def test_the_warm_code_before_kimi_fails_the_strict_capture(runs: dict[str, Any]) -> None:
    capture = runs["before-kimi"]["capture"]
    assert "transport-registry: registry miss" in capture["error"]
    assert capture["replays"] == 0 and runs["before-kimi"]["discovered"] == []
    assert (
        "warmup found no transport signature in the stand-in model"
        in (runs["before-kimi"]["failures"])
    )


class WorldOfOne:
    """A world-1 transport: the gather and the reduction of one rank are identities."""

    def gather_queries(self, q: torch.Tensor) -> torch.Tensor:
        return q

    def reduce_outputs(self, partial: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        return partial


class OneTransport:
    def get(self, signature: TransportSignature) -> WorldOfOne:
        return WorldOfOne()

    def get_or_create(self, signature: TransportSignature, group: Any = None) -> WorldOfOne:
        raise AssertionError("never created here")


def kimi_step() -> SmokeStep:
    layers = (SmokeLayer("a", 96, 576, 512), SmokeLayer("b", 96, 576, 512))
    return SmokeStep(layers, registry=OneTransport(), device=torch.device("cpu"))


def test_the_reference_agrees_with_the_step() -> None:
    step = kimi_step()
    for out, ref in zip(step(step.make_inputs(3)), step.reference(3), strict=True):
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


def test_the_reference_catches_a_step_that_attends_to_the_wrong_cache() -> None:
    step = kimi_step()
    step.kv = (step.kv[1], step.kv[0])  # the layers' caches swapped
    out, ref = step(step.make_inputs(3))[0], step.reference(3)[0]
    assert not torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2)


def test_a_cuda_device_without_index_becomes_the_current_one() -> None:
    assert indexed(torch.device("cuda"), lambda: 3) == torch.device("cuda", 3)
    assert indexed(torch.device("cuda", 1), lambda: 3) == torch.device("cuda", 1)
    assert indexed(torch.device("cpu"), lambda: 3) == torch.device("cpu")


def test_a_process_group_that_fails_becomes_a_failed_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @contextmanager
    def broken(backend: str) -> Iterator[None]:
        raise RuntimeError(f"{backend} init failed")
        yield

    monkeypatch.setattr(smoke_run, "world_of_one", broken)
    result = run_smoke(SmokeConfig(device="cpu"))
    assert "the one-rank gloo process group failed: RuntimeError: gloo init failed" in (
        result.capture.error
    )
    assert result.controls == ()
    assert "transport-registry control is missing from the run" in result.failures
