"""The run's signal hold: ^C and SIGTERM raise while torchrun runs (the launch ends the tree on
them) and are held from torchrun's exit until the bundle is done; what it caught becomes the
run's interruption. The real runs are in tests/test_reliability_endings.py."""

from __future__ import annotations

import gc
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from harness.launch import ending
from harness.launch.launcher import launch
from harness.launch.plan import RunOptions, build_plan
from harness.launch.progress import Snapshot
from harness.schema.launch import Launch

pytestmark = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="needs the main thread"
)


def told_hold() -> tuple[ending.Hold, list[str]]:
    told: list[str] = []
    return ending.Hold(tell=told.append), told


@pytest.mark.parametrize(
    ("sig", "raised"),
    [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, ending.Terminated)],
    ids=["ctrl-c", "sigterm"],
)
def test_until_torchrun_exits_a_signal_raises_as_the_launch_expects(
    sig: signal.Signals, raised: type[BaseException]
) -> None:
    hold, told = told_hold()
    with hold, pytest.raises(raised) as caught:
        signal.raise_signal(sig)
    assert caught.type is raised
    assert hold.caught == [] and told == [] and hold.interruption() is None


def test_once_started_signals_are_held_remembered_in_order_and_told_each_time() -> None:
    hold, told = told_hold()
    with hold:
        hold.start()
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)  # a second one does not abort the finishing either
        still_running = True
    assert still_running
    assert [h.signal for h in hold.caught] == [signal.SIGTERM, signal.SIGINT]
    assert len(told) == 2 and "SIGTERM: the bundle is being finished first" in told[0]
    assert "SIGINT again: the bundle is being finished first" in told[1]


def test_the_handlers_before_the_hold_are_back_after_it() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    hold, _ = told_hold()
    with hold:
        assert signal.getsignal(signal.SIGINT) != before[signal.SIGINT]
    assert {s: signal.getsignal(s) for s in before} == before


def test_the_first_held_signal_is_the_interruption_with_how_far_the_tests_got() -> None:
    hold, _ = told_hold()
    with hold:
        hold.start()
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
    first = hold.interruption(Snapshot(elapsed_s=5.0, world_size=2, done=3, total=3))
    assert first is not None
    assert first.signal == "SIGTERM" and first.exit_code == 128 + signal.SIGTERM
    assert first.at == hold.caught[0].at and first.after_s >= 0
    assert (first.tests_done, first.tests_collected) == (3, 3)


def test_naming_marks_a_launch_interrupted_only_when_it_was_not_already() -> None:
    hold, _ = told_hold()
    quiet = Launch(exit_code=0)
    assert hold.name_in(quiet) is quiet and not hold.named  # nothing held: nothing named
    with hold:
        hold.start()
        signal.raise_signal(signal.SIGINT)
    named = hold.name_in(quiet)
    assert named.interrupted is not None and named.interrupted.signal == "SIGINT"
    assert hold.named and quiet.interrupted is None
    earlier = ending.interruption(signal.SIGTERM, 1.0)
    already = Launch(exit_code=143, interrupted=earlier)
    assert hold.name_in(already).interrupted == earlier  # the launch's own signal came first


def test_a_signal_while_the_launch_cleans_up_after_torchrun_is_held_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun (here an agent that exits at once) has exited; ^C comes while the launch reaps
    what it left: the launch still returns its result, and the hold has the signal."""
    plan = build_plan(RunOptions(nproc_per_node=2, timeout_s=60), tmp_path / "out")
    plan = replace(plan, argv=(sys.executable, "-c", "pass"))
    real_reap = ending.reap

    def reap_under_signal(procs: object) -> None:
        signal.raise_signal(signal.SIGINT)
        real_reap(procs)  # type: ignore[arg-type]

    monkeypatch.setattr(ending, "reap", reap_under_signal)
    hold, told = told_hold()
    with hold:
        result = launch(plan, tick_s=0.1, hold=hold)
    assert result.exit_code == 0 and result.interrupted is None
    assert [h.signal for h in hold.caught] == [signal.SIGINT] and len(told) == 1


@pytest.mark.parametrize("held", [True, False], ids=["run-hold", "launch-own-handlers"])
def test_a_signal_whose_exception_python_dropped_still_ends_the_launch_as_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: bool
) -> None:
    """The handler runs inside a gc callback, whose exceptions Python reports and drops: the
    launch's loop raises the interruption again, so the run ends now instead of running on
    with every later signal only held. A launch called without a hold (the bench's) has the
    same handlers of its own."""
    plan = build_plan(RunOptions(nproc_per_node=2, timeout_s=60), tmp_path / "out")
    plan = replace(plan, argv=(sys.executable, "-c", "import time; time.sleep(20)"))
    dropped: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: dropped.append(info.exc_value))

    def signal_inside_gc(phase: str, info: object) -> None:
        if phase == "start" and not dropped:
            signal.raise_signal(signal.SIGTERM)

    def tick(elapsed: float) -> None:
        gc.callbacks.append(signal_inside_gc)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(signal_inside_gc)

    if held:
        hold, _ = told_hold()
        with hold:
            result = launch(plan, tick=tick, tick_s=0.1, hold=hold)
    else:
        result = launch(plan, tick=tick, tick_s=0.1)
    assert [type(e) for e in dropped] == [ending.Terminated]  # Python dropped it, as in a run
    assert result.interrupted is not None and result.interrupted.signal == "SIGTERM"
    assert result.elapsed_s < 15, result.elapsed_s
