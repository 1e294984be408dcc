"""Each detector's events as a reviewer reads them in the evidence: the exact text, the stack
and phase of the lazy call (not of the window's close), each backstop firing exactly when its
counter moved beyond the live events, and the hooks gone after every window, also when
something else already removed them.

In process, with fakes for what would need a process group or a compile (the real registry,
torch.distributed and dynamo paths are in tests/test_capture_detectors.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _support.detector_fakes import (
    GROUPS_BEFORE,
    FakeRegistry,
    Strict,
    fake_dist,
)

from harness.capture.detectors import (
    DynamoDetector,
    ProcessGroupDetector,
    TransportBufferDetector,
    TransportRegistryDetector,
    c10d_groups,
    describe_compile,
)
from harness.capture.events import LazySpecializationError
from harness.core.signature import TransportSignature
from harness.transport.events import (
    BufferAllocated,
    OperationFirstUse,
    RegistryCounters,
    RegistryMiss,
    TransportCreated,
)

SIG = TransportSignature("bf16", 8, 576, 512, 2, max_tokens=4)

# -- transport registry and buffers ---------------------------------------------------------


def test_registry_events_read_in_full_with_the_registrys_stack() -> None:
    registry = FakeRegistry()
    detector = TransportRegistryDetector(registry)
    detector.start()
    registry.emit(RegistryMiss(SIG, op="get", stack="miss stack"))
    registry.emit(TransportCreated(SIG, "created stack", backend="torch", strategy="a2a"))
    registry.emit(OperationFirstUse(SIG, "gather", "float16", "use stack", rank=0, frozen=True))
    registry.emit(object())  # not a registry event: nothing
    registry.counters = RegistryCounters(misses=1, creations=1, first_uses=1)
    detector.stop()
    assert [(e.what, e.stack, e.signature) for e in detector.events] == [
        (
            "registry miss in get: this transport was not warmed and would be created lazily "
            "inside capture",
            "miss stack",
            SIG,
        ),
        ("transport created lazily inside capture (torch/a2a)", "created stack", SIG),
        (
            "first use of gather with float16 inside capture: warmup never ran this operation "
            "with this dtype, so its kernels specialize lazily here",
            "use stack",
            SIG,
        ),
    ]


def _registry_delivers(registry: FakeRegistry, event: object) -> None:
    registry.emit(event)


def test_an_event_without_a_stack_gets_the_stack_that_delivered_it() -> None:
    registry = FakeRegistry()
    detector = TransportRegistryDetector(registry)
    detector.start()
    _registry_delivers(registry, RegistryMiss(SIG, op="get"))
    registry.counters = RegistryCounters(misses=1)
    detector.stop()
    [event] = detector.events
    assert "in _registry_delivers" in event.stack


def test_each_registry_backstop_reads_in_full_and_fires_only_beyond_the_live_events() -> None:
    registry = FakeRegistry()
    registry.counters = RegistryCounters(misses=5, creations=5, first_uses=5)  # before the window
    detector = TransportRegistryDetector(registry)
    detector.start()
    registry.emit(RegistryMiss(SIG, op="get"))
    registry.counters = RegistryCounters(misses=7, creations=6, first_uses=5)
    detector.stop()
    assert [(e.what, e.stack) for e in detector.events[1:]] == [
        (
            "registry miss: the registry counted 1 more misses in the window than its events "
            "reported",
            detector.events[1].stack,
        ),
        (
            "transport created: the registry counted 1 more creations in the window than its "
            "events reported",
            detector.events[2].stack,
        ),
    ]
    registry.counters = RegistryCounters(first_uses=4)
    detector.start()
    registry.counters = RegistryCounters(first_uses=5)  # one more than its (zero) events
    detector.stop()
    assert [e.what for e in detector.events] == [
        "first use of: the registry counted 1 more first_uses in the window than its events "
        "reported"
    ]


def test_a_counter_that_matches_its_events_adds_nothing() -> None:
    registry = FakeRegistry()
    detector = TransportBufferDetector(registry)
    detector.start()
    registry.emit(BufferAllocated(SIG, "gather_recv", 64, "alloc stack"))
    registry.emit(BufferAllocated(None, "scratch", 8, ""))
    registry.counters = RegistryCounters(buffer_allocations=2)
    detector.stop()
    assert [(e.what, e.signature) for e in detector.events] == [
        (
            "buffer allocation 'gather_recv' of 64 bytes through the transport registry's "
            "allocator",
            SIG,
        ),
        ("buffer allocation 'scratch' of 8 bytes through the transport registry's allocator", None),
    ]
    assert detector.events[0].stack == "alloc stack"
    detector.start()
    registry.counters = RegistryCounters(buffer_allocations=3)
    detector.stop()
    assert [e.what for e in detector.events] == [
        "buffer allocation: the registry's allocator counted 1 more allocations in the window "
        "than its events reported"
    ]
    assert registry.subscribers == []


# -- process groups ---------------------------------------------------------------------------

WHAT = "inside the capture window: a new process group and communicator"


def _group_whats(*calls: str) -> list[str]:
    return [f"torch.distributed.{call} {WHAT}" for call in calls]


def test_a_factory_call_reads_its_first_two_arguments_and_its_group_keywords() -> None:
    public, c10d, calls = fake_dist()
    detector = ProcessGroupDetector((public, c10d))
    detector.start()
    public.new_group([0, 1], 30, "gloo")  # a third positional argument is left out
    public.new_group(ranks=[2], backend="gloo", timeout=5)  # timeout is not a group keyword
    public.new_subgroups(group_size=2, ranks_per_subgroup_list=[[0], [1]])
    public.split_group(split_ranks=[[0], [1]])
    detector.stop()
    assert [e.what for e in detector.events] == _group_whats(
        "new_group([0, 1], 30)",
        "new_group(ranks=[2], backend='gloo')",
        "new_subgroups(group_size=2, ranks_per_subgroup_list=[[0], [1]])",
        "split_group(split_ranks=[[0], [1]])",
    )
    assert calls[-1] == "split_group"  # patched although the factory before it is missing


@pytest.mark.parametrize(
    ("ranks", "shown"),
    [
        ("r" * 112, "ranks='" + "r" * 112 + "'"),  # 120 characters: shown whole
        ("r" * 113, "ranks='" + "r" * 110 + "..."),  # 121: cut to 117 and "..."
    ],
)
def test_a_long_call_is_cut_to_120_characters(ranks: str, shown: str) -> None:
    public, c10d, _ = fake_dist()
    detector = ProcessGroupDetector((public, c10d))
    detector.start()
    public.new_group(ranks=ranks)
    detector.stop()
    assert len(shown) == 120
    assert [e.what for e in detector.events] == _group_whats(f"new_group({shown})")


def test_the_group_counter_backstop_reads_in_full_with_no_stack() -> None:
    public, c10d, _ = fake_dist()
    bound = public.new_group  # taken before the window: the wrapper never sees it
    detector = ProcessGroupDetector((public, c10d))
    detector.start()
    bound([0])
    detector.stop()
    [event] = detector.events
    assert event.what == (
        "1 process group(s) created inside the capture window without going through a wrapped "
        "factory (seen by the c10d group counter)"
    )
    assert event.stack == ""


def test_a_group_that_only_enters_the_map_is_counted_too() -> None:
    public, c10d, _ = fake_dist()
    detector = ProcessGroupDetector((public, c10d))
    detector.start()
    c10d.local_group("a")
    c10d.local_group("b")
    detector.stop()
    [event] = detector.events
    assert event.what.startswith("2 process group(s) created inside the capture window")


def test_a_quiet_window_and_a_reported_group_add_no_counter_event() -> None:
    public, c10d, _ = fake_dist()
    detector = ProcessGroupDetector((public, c10d))
    detector.start()
    detector.stop()
    assert detector.events == []
    detector.start()
    public.new_group([0])
    detector.stop()
    assert len(detector.events) == 1  # the counter moved, but the live event said so


def test_the_groups_are_read_from_the_c10d_module_given(monkeypatch) -> None:
    _, c10d, _ = fake_dist()
    assert c10d_groups(c10d) == (GROUPS_BEFORE, 2)
    real = sys.modules["torch.distributed.distributed_c10d"]
    monkeypatch.setattr(real, "_world", SimpleNamespace(group_count=7, pg_map={1: 1}))
    assert c10d_groups() == (7, 1)  # none given: torch's own


def test_without_torch_distributed_the_detector_says_so(monkeypatch) -> None:
    monkeypatch.setattr(torch.distributed, "is_available", lambda: False)
    status = ProcessGroupDetector(()).status()
    assert (status.active, status.reason) == (
        False,
        "torch.distributed is not available in this torch build",
    )


# -- dynamo -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("compile_id", "trigger", "kind"),
    [
        ("3/0", "DYNAMO", "first compile of frame 3"),
        ("12/1", "LAZY", "recompile #1 of frame 12"),
        ("[0/4]", "X", "recompile #4 of frame 0"),
        ("?", "unknown", "compile"),
    ],
)
def test_describe_compile_reads_in_full(compile_id: str, trigger: str, kind: str) -> None:
    assert describe_compile(compile_id, trigger) == (
        f"dynamo {kind} (compile id {compile_id}, trigger {trigger}) inside the capture window"
    )


@pytest.fixture
def dynamo_imported() -> None:
    import torch._dynamo  # noqa: F401


@pytest.fixture
def unimported_dynamo(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """A process that has not imported dynamo (it is put back after the test); the returned
    call completes "the import", as if whatever asked for it had finished importing it."""
    import torch._dynamo as dynamo

    monkeypatch.delitem(sys.modules, "torch._dynamo")
    return lambda: monkeypatch.setitem(sys.modules, "torch._dynamo", dynamo)


def _compile_starts(detector: DynamoDetector, args: object) -> None:
    """Where dynamo would call the detector's start callback from."""
    detector._on_start(args)


def _frames_counter(monkeypatch: pytest.MonkeyPatch, *values: int) -> None:
    counts = iter(values)
    monkeypatch.setattr(DynamoDetector, "_frames", staticmethod(lambda: next(counts)))


def test_a_compile_is_reported_with_the_stack_and_phase_where_it_started(
    monkeypatch: pytest.MonkeyPatch, dynamo_imported: None
) -> None:
    _frames_counter(monkeypatch, 10, 12)  # frames moved, but callbacks said so
    detector = DynamoDetector()
    detector.start()
    trigger = SimpleNamespace(name="DYNAMO")
    _compile_starts(detector, SimpleNamespace(callback_trigger=trigger, compile_id="7/1"))
    detector.enter_phase("capture")
    _compile_starts(detector, SimpleNamespace())  # dynamo's args without those fields
    detector.stop()
    assert [(e.what, e.phase) for e in detector.events] == [
        (
            "dynamo recompile #1 of frame 7 (compile id 7/1, trigger DYNAMO) inside the "
            "capture window",
            "warmup",
        ),
        ("dynamo compile (compile id ?, trigger unknown) inside the capture window", "capture"),
    ]
    assert all("in _compile_starts" in e.stack for e in detector.events)


@pytest.mark.parametrize(("before", "after"), [(10, 11), (0, 3)])
def test_the_frame_counter_backstop_reads_in_full_with_no_stack(
    monkeypatch: pytest.MonkeyPatch, dynamo_imported: None, before: int, after: int
) -> None:
    _frames_counter(monkeypatch, before, after)
    detector = DynamoDetector()
    detector.start()
    detector.stop()
    [event] = detector.events
    assert event.what == (
        f"dynamo compiled {after - before} frame(s) in the window that no callback reported "
        "(frames.total counter)"
    )
    assert event.stack == ""


def test_a_window_without_compiles_is_quiet(
    monkeypatch: pytest.MonkeyPatch, dynamo_imported: None
) -> None:
    _frames_counter(monkeypatch, 5, 5)
    detector = DynamoDetector()
    detector.start()
    detector.stop()
    assert detector.events == []


def test_the_real_frame_counter_is_read(dynamo_imported: None) -> None:
    """A frame dynamo counted without calling back (its counter is the backstop's source)."""
    from torch._dynamo.utils import counters

    detector = DynamoDetector()
    detector.start()
    counters["frames"]["total"] += 2
    detector.stop()
    [event] = detector.events
    assert event.what.startswith("dynamo compiled 2 frame(s) in the window")


def test_the_compile_callback_is_registered_only_while_the_window_is_open(
    dynamo_imported: None,
) -> None:
    from torch._dynamo.callback import callback_handler

    detector = DynamoDetector()
    detector.start()
    assert detector._on_start in callback_handler.start_callbacks
    detector.stop()
    assert detector._on_start not in callback_handler.start_callbacks


def test_stop_holds_when_something_else_already_removed_the_hooks(
    monkeypatch: pytest.MonkeyPatch, dynamo_imported: None
) -> None:
    """`torch._dynamo.reset()` inside a window clears every callback; the import watch can be
    taken off sys.meta_path by other code. Closing the window must still work."""
    from torch._dynamo.callback import callback_handler

    detector = DynamoDetector()
    detector.start()
    callback_handler.remove_start_callback(detector._on_start)
    detector.stop()
    monkeypatch.delitem(sys.modules, "torch._dynamo")
    detector.start()
    sys.meta_path.remove(detector._watch)
    detector.stop()
    assert detector.events == [] and detector._watch is None


def test_one_detector_serves_windows_before_and_after_dynamos_import(
    monkeypatch: pytest.MonkeyPatch, unimported_dynamo: Callable[[], None]
) -> None:
    _frames_counter(monkeypatch, 4, 4)
    detector = DynamoDetector()
    detector.start()  # not imported: the import watch
    watch = detector._watch
    detector.stop()
    assert watch is not None and watch not in sys.meta_path
    unimported_dynamo()
    detector.start()  # imported: the callback
    detector.stop()
    monkeypatch.delitem(sys.modules, "torch._dynamo")
    detector.start()  # not imported again
    detector.stop()
    assert detector.events == []


def _imports_dynamo(watch: Any) -> None:
    """What `import torch._dynamo` asks the first finder on sys.meta_path."""
    watch.find_spec("torch._dynamo")


def _imports_other(watch: Any) -> None:
    watch.find_spec("json.decoder")


def test_the_import_event_has_the_importers_stack_and_phase_and_reads_in_full(
    monkeypatch: pytest.MonkeyPatch, unimported_dynamo: Callable[[], None]
) -> None:
    _frames_counter(monkeypatch, 1)
    detector = DynamoDetector()
    detector.start()
    _imports_other(sys.meta_path[0])
    _imports_dynamo(sys.meta_path[0])  # in warm-up
    detector.enter_phase("capture")
    _imports_dynamo(sys.meta_path[0])  # the second ask is not the import's start
    unimported_dynamo()  # the import completed
    detector.stop()
    assert [(e.what, e.phase) for e in detector.events] == [
        (
            "torch._dynamo imported inside the capture window: torch.compile set up lazily "
            "(nothing imported it before capture)",
            "warmup",
        ),
        (
            "dynamo compiled 1 frame(s) in the window after importing it there (frames.total "
            "counter)",
            "warmup",
        ),
    ]
    for event in detector.events:
        assert "in _imports_dynamo" in event.stack and "_imports_other" not in event.stack


def test_an_import_that_went_around_the_watch_is_still_reported(
    monkeypatch: pytest.MonkeyPatch, unimported_dynamo: Callable[[], None]
) -> None:
    _frames_counter(monkeypatch, 0)
    detector = DynamoDetector()
    detector.start()
    detector.enter_phase("capture")
    unimported_dynamo()  # no finder was asked
    detector.stop()
    [event] = detector.events
    assert event.what.startswith("torch._dynamo imported inside the capture window")
    assert (event.stack, event.phase) == ("", "capture")


def test_only_dynamos_import_is_lazy_work_and_nothing_imports_it_for_the_check(
    unimported_dynamo: Callable[[], None],
) -> None:
    detector = DynamoDetector()
    detector.start()
    _imports_other(sys.meta_path[0])
    detector.stop()
    assert detector.events == []
    detector.start()
    _imports_dynamo(sys.meta_path[0])  # asked, but the import has not happened yet
    detector.stop()
    assert len(detector.events) == 1  # no frame count: dynamo is still not imported
    assert "torch._dynamo" not in sys.modules


def test_an_imported_dynamo_needs_no_lookup(monkeypatch: pytest.MonkeyPatch, dynamo_imported):
    import importlib.util

    def no_lookup(name: str) -> None:
        raise AssertionError("dynamo is imported: nothing to look up")

    monkeypatch.setattr(importlib.util, "find_spec", no_lookup)
    assert DynamoDetector().unavailable_reason() is None


def _not_in_this_build(name: str) -> None:
    return None


def _broken_finder(name: str) -> None:
    raise ValueError("broken finder")


@pytest.mark.parametrize(
    ("find_spec", "reason"),
    [
        (_not_in_this_build, "torch._dynamo is not part of this torch build"),
        (_broken_finder, "torch._dynamo is not importable (ValueError: broken finder)"),
    ],
)
def test_a_torch_without_dynamo_says_why(
    monkeypatch: pytest.MonkeyPatch,
    unimported_dynamo: Callable[[], None],
    find_spec: Any,
    reason: str,
) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    status = DynamoDetector().status()
    assert (status.active, status.reason) == (False, reason)


def test_a_strict_window_raises_the_compile_at_stop_not_inside_dynamo(
    monkeypatch: pytest.MonkeyPatch, dynamo_imported: None
) -> None:
    _frames_counter(monkeypatch, 0, 1)
    detector, sink = DynamoDetector(), Strict()
    detector.start(sink)
    _compile_starts(detector, SimpleNamespace(compile_id="0/0"))
    assert sink.seen == []
    with pytest.raises(LazySpecializationError, match="first compile of frame 0"):
        detector.stop()
