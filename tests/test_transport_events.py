"""The stacks transport events carry: where a transport, buffer or first use was asked for."""

from __future__ import annotations

from pathlib import Path

from harness.transport import events
from harness.transport.events import short_stack

_TRANSPORT = str(Path(events.__file__).resolve().parent)


def _frames(stack: str) -> list[str]:
    return [line for line in stack.splitlines() if line.startswith('  File "')]


def _ask(limit: int | None) -> str:
    return short_stack() if limit is None else short_stack(limit)


def _ping(depth: int, limit: int | None) -> str:
    return _pong(depth - 1, limit) if depth else _ask(limit)


def _pong(depth: int, limit: int | None) -> str:  # two callers: no "[Previous line repeated]"
    return _ping(depth - 1, limit) if depth else _ask(limit)


def _callers(stack: str) -> list[str]:
    """Function names, innermost last, without mutmut's trampolines (one more frame per call of
    a mutated function under mutation testing)."""
    return [f.rsplit(" in ", 1)[-1] for f in _frames(stack) if "/mutmut/" not in f]


def test_a_transport_event_keeps_the_last_eight_frames_ending_at_its_caller() -> None:
    deep = _ping(12, None)
    assert len(_frames(deep)) == 8
    assert _callers(deep)[-1] == "_ask"
    assert not any(_TRANSPORT in f for f in _frames(deep))


def test_a_transport_event_keeps_as_many_frames_as_asked() -> None:
    deep = _ping(12, 6)
    assert len(_frames(deep)) == 6
    assert _callers(deep)[-1] == "_ask"
