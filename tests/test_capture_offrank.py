"""The controls run off the ranks: the child runs exactly a rank's control window, and a child
that gives no verdict is an error, never a pass."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from harness.capture.offrank import VARIANTS, ControlOutcome, OffRankControls, run_control
from harness.errors import QualificationError


@pytest.mark.parametrize("detector", ["dynamo", "transport-registry"])
def test_a_control_is_seen_by_its_detector_only_and_unseen_without_it(detector) -> None:
    seen = run_control(detector, removed=False, device="cpu", rank=0, world_size=1)
    assert seen.done > 0 and seen.seen == (detector,)
    assert {e.detector for e in seen.events} == {detector} and seen.path == "cpu-simulated"
    assert any(s.name == detector and s.active for s in seen.statuses)
    unseen = run_control(detector, removed=True, device="cpu", rank=0, world_size=1)
    assert unseen.done > 0 and unseen.seen == () and not unseen.events
    for outcome in (seen, unseen):
        assert ControlOutcome.from_json(json.loads(json.dumps(outcome.to_json()))) == outcome


def test_an_outcome_with_a_key_the_model_does_not_know_is_refused() -> None:
    outcome = {"done": 1, "seen": [], "path": "cpu-simulated", "events": [], "statuses": []}
    assert ControlOutcome.from_json(outcome).done == 1
    with pytest.raises(ValidationError, match="Unexpected keyword argument"):
        ControlOutcome.from_json({**outcome, "passed": True})


def child(code: str) -> OffRankControls:
    pipe = subprocess.PIPE
    process = subprocess.Popen([sys.executable, "-c", code], stdout=pipe, stderr=pipe, text=True)
    return OffRankControls("dynamo", process)


def test_the_child_s_last_line_carries_both_outcomes() -> None:
    outcome = {"done": 1, "seen": ["dynamo"], "path": "cpu-simulated", "events": [], "statuses": []}
    printed = json.dumps({variant: outcome for variant in VARIANTS})
    got = child(f"print('a warning'); print({printed!r})").outcomes(60)
    assert set(got) == set(VARIANTS) and got["detected"].seen == ("dynamo",)


@pytest.mark.parametrize(
    "code, says",
    [
        ("import sys; sys.stderr.write('boom'); sys.exit(3)", "exited 3: boom"),
        ("pass", "exited 0: no output"),
        ("import time; time.sleep(30)", "gave no result in 0.5s"),
    ],
)
def test_a_child_without_a_verdict_is_an_error(code, says) -> None:
    controls = child(code)
    with pytest.raises(QualificationError, match=says):
        controls.outcomes(0.5 if "sleep" in code else 60)
    assert controls.process.poll() is not None  # never left running
