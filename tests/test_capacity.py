"""The runtime's token capacity for B12X DCP transports, and the stand-ins sized by it."""

from __future__ import annotations

import pytest

from harness.capture.decode import transport_layers
from harness.core.capacity import B12X_DECODE_TOKEN_CAP, TOKEN_CAP_ENV, RuntimeCapacity
from harness.errors import UsageError
from harness.models.builders import build


def test_the_fork_constants() -> None:
    assert (B12X_DECODE_TOKEN_CAP, TOKEN_CAP_ENV) == (8, "VLLM_DCP_A2A_MAX_TOKENS")


@pytest.mark.parametrize(
    ("runtime", "engine", "expected"),
    [
        (RuntimeCapacity(), 64, 64),  # the seed's era: the engine's capacity
        (RuntimeCapacity("engine", 4), 64, 4),  # clamped by the variable
        (RuntimeCapacity("engine", 128), 64, 64),  # a clamp never grows it
        (RuntimeCapacity("decode-cap"), 64, 8),
        (RuntimeCapacity("decode-cap"), 2, 2),  # never more than the engine gives
        (RuntimeCapacity("decode-cap", 16), 64, 16),  # the variable overrides the cap
    ],
)
def test_runtime_capacity(runtime: RuntimeCapacity, engine: int, expected: int) -> None:
    assert runtime.tokens(engine) == expected


def test_from_env() -> None:
    assert RuntimeCapacity.from_env({}) == RuntimeCapacity()
    assert RuntimeCapacity.from_env({TOKEN_CAP_ENV: " 4 "}).env_cap == 4
    assert RuntimeCapacity.from_env({}, policy="decode-cap").cap == 8
    for bad in ("four", "0", "-2"):
        with pytest.raises(UsageError, match=TOKEN_CAP_ENV):
            RuntimeCapacity.from_env({TOKEN_CAP_ENV: bad})
    with pytest.raises(UsageError, match="unknown token capacity policy"):
        RuntimeCapacity("newest")


def capacities(**settings: object) -> set[int]:
    built = build("mixed", tp=16, dcp=2, **settings)  # type: ignore[arg-type]
    return {manager.max_num_tokens for _, _, manager in transport_layers(built)}


def test_stand_in_b12x_managers_take_the_runtime_capacity() -> None:
    assert capacities(max_num_batched_tokens=64) == {64}
    capped = RuntimeCapacity("decode-cap")
    assert capacities(max_num_batched_tokens=64, runtime_capacity=capped) == {8}
    env = RuntimeCapacity("engine", 4)
    assert capacities(max_num_batched_tokens=8, runtime_capacity=env) == {4}
