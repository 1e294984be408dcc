"""The detector base class's contract in detail: the stack an event carries (the caller's last
frames, never the import machinery's), what `report` keeps of what a detector gives it, the
state a window starts from, and that nothing reaches a window's sink once it closed."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from pathlib import Path

import pytest
from _support.detector_fakes import Recording, Strict

from harness.capture.detector import Detector, short_stack
from harness.capture.events import LazySpecializationError
from harness.core.signature import TransportSignature
from harness.transport.events import caller_stack

SIG = TransportSignature("bf16", 8, 576, 512, 2, max_tokens=4)


class Manual(Detector):
    """A detector whose events the test reports by hand."""

    name = "manual"

    def _install(self) -> None:
        pass

    def _uninstall(self) -> None:
        pass


def _frames(stack: str) -> list[str]:
    """The `File "...", line N, in NAME` lines of a formatted stack."""
    return [line for line in stack.splitlines() if not line.startswith("    ")]


def _callers(stack: str) -> list[str]:
    """The functions of a stack, innermost last. Without mutmut's frames: under mutation
    testing every call of a mutated function goes through its trampoline, one frame more."""
    return [line.rsplit(" in ", 1)[-1] for line in _frames(stack) if "/mutmut/" not in line]


def _ask(limit: int | None) -> str:
    return short_stack() if limit is None else short_stack(limit)


def _ping(depth: int, limit: int | None) -> str:
    return _pong(depth - 1, limit) if depth else _ask(limit)


def _pong(depth: int, limit: int | None) -> str:
    return _ping(depth - 1, limit) if depth else _ask(limit)


def test_short_stack_keeps_the_last_eight_frames_ending_at_the_caller() -> None:
    deep = _ping(12, None)
    assert len(_frames(deep)) == 8
    assert all(line.startswith('  File "') for line in _frames(deep))
    assert _callers(deep)[-3:] == ["_pong", "_ping", "_ask"]
    three = _ping(12, 3)
    assert len(_frames(three)) == 3 and _callers(three)[-1] == "_ask"
    shallow = _ping(0, 50)  # fewer frames than the limit: all of them, down to the test
    here = "test_short_stack_keeps_the_last_eight_frames_ending_at_the_caller"
    assert _callers(shallow)[-3:] == [here, "_ping", "_ask"]


def test_short_stack_leaves_out_the_import_machinery(tmp_path: Path) -> None:
    """A detector asked from inside an import (dynamo's import watch) names the module that
    imported, not importlib's frozen frames between them."""
    (tmp_path / "asks_during_import.py").write_text(
        "from harness.capture.detector import short_stack\nSTACK = short_stack(limit=50)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("asks_during_import")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("asks_during_import", None)
    assert "asks_during_import.py" in module.STACK
    assert "test_short_stack_leaves_out_the_import_machinery" in module.STACK
    assert "frozen importlib" not in module.STACK


def test_report_keeps_the_stack_and_phase_it_is_given_else_the_callers_and_the_windows() -> None:
    detector = Manual()
    detector.start(rank=2)
    given = detector.report("given", signature=SIG, stack="where it asked", phase="capture")
    assert (given.stack, given.phase, given.signature, given.rank) == (
        "where it asked",
        "capture",
        SIG,
        2,
    )
    empty = detector.report("empty stack", stack="")
    assert empty.stack == "" and empty.signature is None
    default = detector.report("default")
    assert default.phase == "warmup"
    here = "test_report_keeps_the_stack_and_phase_it_is_given_else_the_callers_and_the_windows"
    assert _callers(default.stack)[-1] == here
    detector.enter_phase("capture")
    assert detector.report("later").phase == "capture"
    detector.report("explicit warmup", phase="warmup")
    detector.stop()
    assert [e.what for e in detector.events] == [
        "given",
        "empty stack",
        "default",
        "later",
        "explicit warmup",
    ]
    assert detector.events[-1].phase == "warmup"
    assert all(e.detector == "manual" for e in detector.events)


def test_each_window_starts_in_warmup_with_no_events_and_rank_0_by_default() -> None:
    detector = Manual()
    detector.start(rank=4)
    detector.enter_phase("capture")
    detector.report("first window")
    detector.stop()
    detector.start()
    event = detector.report("second window")
    detector.stop()
    assert detector.events == [event]
    assert (event.rank, event.phase) == (0, "warmup")


def test_a_detector_that_never_ran_has_nothing_and_hands_nothing_to_a_sink() -> None:
    detector = Manual()
    assert detector.events == [] and detector.running is False
    event = detector.report("outside any window", stack="")
    assert (event.rank, event.phase) == (0, "warmup")
    assert detector.events == [event]


def test_nothing_reaches_the_sink_after_the_window_closed() -> None:
    detector, sink = Manual(), Recording()
    detector.start(sink)
    inside = detector.report("inside")
    detector.stop()
    assert detector.running is False
    detector.report("after")  # a late hook call: recorded, but the window is gone
    assert sink.seen == [inside]


def test_a_strict_sink_gets_the_event_itself() -> None:
    detector, sink = Manual(), Strict()
    detector.start(sink)
    with pytest.raises(LazySpecializationError, match="manual: lazy thing"):
        detector.report("lazy thing", stack="")
    assert sink.seen == detector.events and sink.seen[0].what == "lazy thing"
    detector.stop()


def test_status_names_the_detector_and_an_active_one_gives_no_reason() -> None:
    status = Manual().status()
    assert (status.name, status.active, status.reason) == ("manual", True, "")
    assert Manual().running is False


# Under mutation testing a mutated function is called through mutmut's trampoline, one frame
# more that the standard library's stack (taken in the test) does not have: skip it in both.
_MUTMUT = tuple(
    str(Path(origin).resolve().parent)
    for spec in [importlib.util.find_spec("mutmut")]
    if spec is not None and (origin := spec.origin) is not None
)


def _stdlib_stack(skipped: tuple[str, ...], limit: int, *, frozen: bool) -> str:
    """The same stack the slow, obvious way: every frame extracted and resolved, then filtered."""
    frames = [
        frame
        for frame in traceback.extract_stack()[:-1]  # not this helper's own frame
        if not (frozen and frame.filename.startswith("<frozen importlib"))
        and not str(Path(frame.filename).resolve()).startswith(skipped)
    ]
    return "".join(traceback.format_list(frames[-limit:]))


@pytest.mark.parametrize("limit", [1, 3, 8, 200])
def test_caller_stack_writes_what_the_standard_library_writes(limit: int) -> None:
    """Frames kept, their order, their source lines and the format are the standard library's;
    skipped files (here: this test module) leave no frame, however deep they recur."""
    here = str(Path(__file__).resolve())
    skipped = (here, *_MUTMUT)

    def both(depth: int) -> tuple[str, str]:
        if depth:
            return both(depth - 1)
        return caller_stack(skipped, limit), _stdlib_stack(skipped, limit, frozen=False)

    fast, slow = both(5)
    assert fast == slow and fast.count('  File "') == min(limit, slow.count('  File "'))
    assert here not in fast
    kept = caller_stack(_MUTMUT, limit)  # nothing else skipped: the innermost frame is the caller
    assert kept.splitlines()[-2].endswith(
        "in test_caller_stack_writes_what_the_standard_library_writes"
    )


def test_short_stacks_resolve_paths_so_a_link_to_a_skipped_file_is_skipped(tmp_path: Path) -> None:
    """A module imported through a symlinked folder is recognised by its real path."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "linked_caller.py").write_text(
        "from harness.transport.events import caller_stack\n"
        "def ask(skipped):\n    return caller_stack(skipped, 50)\n"
    )
    (tmp_path / "link").symlink_to(real)
    sys.path.insert(0, str(tmp_path / "link"))
    try:
        module = importlib.import_module("linked_caller")
    finally:
        sys.path.remove(str(tmp_path / "link"))
        sys.modules.pop("linked_caller", None)
    files = [line.split('"')[1] for line in _frames(module.ask(()))]
    assert str(tmp_path / "link" / "linked_caller.py") in files  # named as imported
    files = [line.split('"')[1] for line in _frames(module.ask((str(real),)))]
    assert not any(f.endswith("linked_caller.py") for f in files) and files
