"""The smoke's verdict: a clean run passes, and each single fault is caught and named."""

from __future__ import annotations

import json

import pytest
from _support.smoke import FAULTS, H200, passing_result

from harness.schema.smoke import REQUIRED_CONTROLS, SmokeMachine, SmokeResult


def test_a_clean_run_passes() -> None:
    result = passing_result()
    assert result.failures == []
    assert result.passed


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_fails_the_smoke_and_is_named(fault: str) -> None:
    apply, needle = FAULTS[fault]
    result = apply(passing_result())
    assert not result.passed
    assert len(result.failures) == 1, result.failures
    assert needle in result.failures[0]


def test_every_required_control_has_a_fault_that_removes_it() -> None:
    """The control table cannot grow a detector the verdict does not insist on."""
    assert REQUIRED_CONTROLS == (
        "cuda-memory",
        "triton-jit",
        "process-groups",
        "transport-registry",
    )
    for detector in REQUIRED_CONTROLS:
        result = passing_result()
        dropped = SmokeResult(
            **{
                **result.__dict__,
                "controls": tuple(c for c in result.controls if c.detector != detector),
            }
        )
        assert dropped.failures == [f"{detector} control is missing from the run"]


def test_a_control_that_fired_is_the_one_whose_detector_reported_in_capture() -> None:
    control = passing_result().control("cuda-memory")
    assert control is not None and control.fired and control.seen == ("cuda-memory",)


@pytest.mark.parametrize("fault", [None, *sorted(FAULTS)])
def test_results_survive_json(fault: str | None) -> None:
    result = passing_result() if fault is None else FAULTS[fault][0](passing_result())
    again = SmokeResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again == result
    assert again.failures == result.failures


def test_a_result_whose_failures_were_edited_is_refused() -> None:
    data = json.loads(json.dumps(passing_result().to_json()))
    assert data["failures"] == [] and data["schema"] == "dcpqual-smoke-result/v1"
    with pytest.raises(ValueError, match="failures="):
        SmokeResult.from_json({**data, "failures": ["made up"]})
    broken = json.loads(json.dumps(FAULTS["capture-simulated"][0](passing_result()).to_json()))
    with pytest.raises(ValueError, match="failures="):
        SmokeResult.from_json({**broken, "failures": []})
    with pytest.raises(ValueError, match="surprise"):
        SmokeResult.from_json({**data, "surprise": 1})


def test_the_machines_sm_is_its_capability() -> None:
    assert H200.sm == "sm_90"
    assert SmokeMachine(torch="2.13.0", device="cpu", device_name="x").sm == "none"
    data = H200.model_dump()
    assert SmokeMachine.model_validate({**data, "sm": "sm_90"}) == H200
    with pytest.raises(ValueError, match="sm='sm_120' but the fields give 'sm_90'"):
        SmokeMachine.model_validate({**data, "sm": "sm_120"})
