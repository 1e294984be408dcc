"""The rank side stays self-contained and light: the plugin loads no controller or evidence code,
and a rank's suite process (plugin, the suites' conftests, a capture window with every detector,
an output comparison) never imports sympy, torch._dynamo or triton (where installed), which cost
every rank seconds of CPU and tens of MB."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import importlib.util, json, sys
from pathlib import Path
import harness.rank.plugin
controller = sorted(m for m in sys.modules if m.startswith("harness.evidence")
             or m in ("harness.launch.launcher", "harness.launch.plan", "harness.launch.context",
                      "harness.launch.progress", "harness.launch.nodes", "harness.launch.cli"))
for i, conftest in enumerate(sorted(Path("suites").rglob("conftest.py"))):
    spec = importlib.util.spec_from_file_location(f"suite_conftest_{i}", conftest)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
import torch
from harness.capture.check import default_detectors, first_mismatch
from harness.capture.window import CaptureWindow
from harness.transport.registry import TransportRegistry
with TransportRegistry("torch", device="cpu") as registry:
    window = CaptureWindow(default_detectors(registry), registry=registry, rank=0)
    captured = window.capture(lambda inputs: inputs[0] * 2, torch.ones(3))
    same = first_mismatch(captured.replay(torch.ones(3)), [torch.full((3,), 2.0)])
    differ = first_mismatch([torch.ones(3)], [torch.zeros(3)], rtol=0.0, atol=0.0)
HEAVY = ("sympy", "torch._dynamo", "torch.distributed.tensor", "triton")
heavy = sorted(m for m in HEAVY if m in sys.modules)
statuses = {s.name: s.active for s in window.statuses}
# The negative control of the lazily armed dynamo detector: a compile inside the window, in a
# process that never imported dynamo, is caught as the import and as the compiled frame...
from harness.capture.detectors import DynamoDetector
from harness.capture.events import LazySpecializationError
def compiled_step(inputs):
    return torch.compile(lambda x: x + 1, backend="eager")(inputs[0])
record = CaptureWindow([DynamoDetector()], mode="record", rank=0)
record.capture(compiled_step, torch.ones(3))
# ...and once dynamo is imported, a compile inside a strict window still stops it.
try:
    def other_step(inputs):
        return torch.compile(lambda x: x - 1, backend="eager")(inputs[0])
    CaptureWindow([DynamoDetector()], mode="strict", rank=0).capture(other_step, torch.ones(3))
    strict = None
except LazySpecializationError as exc:
    strict = exc.event.what
print(json.dumps({"controller": controller, "heavy": heavy, "same": same,
                  "differ": differ is not None, "statuses": statuses,
                  "events": [[e.detector, e.what, e.phase, e.stack] for e in record.events],
                  "strict": strict}))
"""


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    """One fresh interpreter (one torch import) for every check of this module."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_rank_side_imports_no_controller_and_nothing_heavy(probe):
    assert probe["controller"] == []
    # The probe did the work (a capture with the dynamo detector active, both verdicts)...
    assert probe["same"] is None and probe["differ"] and probe["statuses"]["dynamo"]
    # ...and none of it pulled in the heavy modules.
    assert probe["heavy"] == []


def test_dynamo_imported_and_compiling_inside_a_window_is_lazy_work(probe):
    (imported, compiled) = probe["events"]
    assert imported[:3] == ["dynamo", imported[1], "capture"]
    assert imported[1].startswith("torch._dynamo imported inside the capture window")
    assert "in compiled_step" in imported[3]  # the stack names the code that asked for it
    assert compiled[0] == "dynamo" and compiled[1].startswith("dynamo compiled 1 frame(s)")
    assert probe["strict"] is not None and "first compile of frame" in probe["strict"]
