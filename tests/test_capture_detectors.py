"""The detectors that run everywhere: each fires on its kind of lazy work, stays quiet
otherwise, removes its hooks at stop, and raises through a strict sink at the lazy call.

Single process, no process group: the registry detectors use a real `TransportRegistry`
(lookups and allocations need no collective) or a fake one for creation events; the process
group detector patches fake modules (and is checked to restore the real ones).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from _support.detector_fakes import FakeRegistry, Strict, fake_dist
from _support.gloo_spawn import gloo_group, spawn

from harness.capture.detector import Detector, short_stack, without
from harness.capture.detectors import (
    DynamoDetector,
    ProcessGroupDetector,
    TransportBufferDetector,
    TransportRegistryDetector,
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
from harness.transport.registry import TransportRegistry

SIG = TransportSignature("bf16", 8, 576, 512, 2, max_tokens=4)


# -- base contract ----------------------------------------------------------------------------


class Never(Detector):
    name = "never"

    def unavailable_reason(self) -> str | None:
        return "not on this machine"

    def _install(self) -> None:
        raise AssertionError("an unavailable detector must never install")

    def _uninstall(self) -> None:
        pass


def test_unavailable_detector_says_why_and_refuses_to_start() -> None:
    status = Never().status()
    assert not status.active and status.reason == "not on this machine"
    with pytest.raises(RuntimeError, match="not on this machine"):
        Never().start()


def test_detector_cannot_start_twice_and_stop_is_idempotent() -> None:
    detector = TransportRegistryDetector(TransportRegistry())
    detector.start()
    with pytest.raises(RuntimeError, match="already running"):
        detector.start()
    detector.stop()
    detector.stop()
    assert not detector.running


def test_without_removes_by_name_and_rejects_unknown_names() -> None:
    registry = TransportRegistry()
    detectors = [TransportRegistryDetector(registry), TransportBufferDetector(registry)]
    assert [d.name for d in without(detectors, "transport-registry")] == ["transport-buffers"]
    with pytest.raises(ValueError, match="no detector named"):
        without(detectors, "transport-regsitry")


def test_short_stack_shows_the_caller_not_the_machinery() -> None:
    stack = short_stack()
    assert "test_short_stack_shows_the_caller" in stack
    assert "harness/capture/detector.py" not in stack


# -- transport registry -----------------------------------------------------------------------


def test_registry_miss_is_reported_with_its_signature() -> None:
    registry = TransportRegistry()
    detector = TransportRegistryDetector(registry)
    detector.start(rank=5)
    assert registry.get(SIG) is None
    detector.stop()
    registry.get(SIG)  # after stop: not watched any more
    [event] = detector.events
    assert event.detector == "transport-registry" and event.rank == 5
    assert event.signature == SIG and "registry miss in get" in event.what
    assert "test_registry_miss_is_reported" in event.stack


def test_strict_sink_stops_the_lookup_at_the_miss() -> None:
    registry = TransportRegistry()
    detector = TransportRegistryDetector(registry)
    sink = Strict()
    detector.start(sink)
    with pytest.raises(LazySpecializationError, match="576 -> 512"):
        registry.get(SIG)
    detector.stop()
    assert len(sink.seen) == 1


def test_creation_is_reported_and_buffers_are_not_the_registry_detectors_job() -> None:
    registry = FakeRegistry()
    detector = TransportRegistryDetector(registry)
    detector.start()
    registry.emit(RegistryMiss(SIG, op="get_or_create"))
    registry.emit(BufferAllocated(SIG, "gather_send", 16, "stack"))
    registry.emit(TransportCreated(SIG, "stack", backend="torch", strategy="ag_rs"))
    registry.counters = RegistryCounters(creations=1, misses=1, buffer_allocations=1)
    detector.stop()
    assert [e.what.split(":")[0] for e in detector.events] == [
        "registry miss in get_or_create",
        "transport created lazily inside capture (torch/ag_rs)",
    ]
    assert registry.subscribers == []


def test_registry_counters_are_a_backstop_for_unreported_work() -> None:
    registry = FakeRegistry()
    detector = TransportRegistryDetector(registry)
    detector.start()
    registry.counters = RegistryCounters(creations=1, misses=2)  # nobody emitted an event
    detector.stop()
    whats = [e.what for e in detector.events]
    assert any("2 more misses" in w for w in whats)
    assert any("1 more creations" in w for w in whats)


def test_first_use_of_an_operation_and_dtype_is_reported() -> None:
    registry = FakeRegistry()
    detector = TransportRegistryDetector(registry)
    detector.start(rank=3)
    registry.emit(OperationFirstUse(SIG, "reduce", "bfloat16", "stack", rank=3, frozen=True))
    registry.counters = RegistryCounters(first_uses=1)
    detector.stop()
    [event] = detector.events
    assert event.signature == SIG and event.rank == 3
    assert event.what.startswith("first use of reduce with bfloat16 inside capture")


def test_first_use_counter_is_a_backstop() -> None:
    registry = FakeRegistry()
    detector = TransportRegistryDetector(registry)
    detector.start()
    registry.counters = RegistryCounters(first_uses=2)  # nobody emitted an event
    detector.stop()
    assert [e.what for e in detector.events] == [
        "first use of: the registry counted 2 more first_uses in the window than its events "
        "reported"
    ]


def test_the_real_registry_reports_each_operation_and_dtype_once() -> None:
    """`_used` is what a transport calls before each operation; only the first call of an
    (operation, dtype) pair is an event, and it is recorded only if no subscriber refused."""
    registry = TransportRegistry()
    registry._used(SIG, "gather", torch.bfloat16)  # warmup, before the window
    detector = TransportRegistryDetector(registry)
    sink = Strict()
    detector.start(sink)
    registry._used(SIG, "gather", torch.bfloat16)  # warm: nothing
    with pytest.raises(LazySpecializationError, match="first use of reduce with bfloat16"):
        registry._used(SIG, "reduce", torch.bfloat16)
    with pytest.raises(LazySpecializationError, match="first use of gather with float16"):
        registry._used(SIG, "gather", torch.float16)
    detector.stop()
    assert len(sink.seen) == 2
    assert registry.operations(SIG) == (("gather", "bfloat16"),)  # the refused ones never ran
    assert registry.counters.first_uses == 1
    registry._used(SIG, "reduce", torch.bfloat16)
    assert registry.operations(SIG) == (("gather", "bfloat16"), ("reduce", "bfloat16"))


def test_quiet_registry_gives_no_events() -> None:
    registry = TransportRegistry()
    detectors = [TransportRegistryDetector(registry), TransportBufferDetector(registry)]
    for detector in detectors:
        detector.start()
    for detector in detectors:
        detector.stop()
    assert all(d.events == [] for d in detectors)


# -- transport buffers ------------------------------------------------------------------------


def test_buffer_allocation_is_reported() -> None:
    registry = TransportRegistry()
    detector = TransportBufferDetector(registry)
    detector.start()
    registry.allocator.empty((4, 2), torch.float32, owner=SIG, name="staging")
    detector.stop()
    [event] = detector.events
    assert "'staging' of 32 bytes" in event.what and event.signature == SIG


def test_strict_sink_stops_the_allocation() -> None:
    registry = TransportRegistry()
    detector = TransportBufferDetector(registry)
    detector.start(Strict())
    with pytest.raises(LazySpecializationError, match="staging"):
        registry.allocator.empty((4,), torch.uint8, owner=None, name="staging")
    detector.stop()
    assert registry.counters.buffer_allocations == 0


def test_buffer_counter_is_a_backstop() -> None:
    registry = FakeRegistry()
    detector = TransportBufferDetector(registry)
    detector.start()
    registry.counters = replace(registry.counters, buffer_allocations=3)
    detector.stop()
    [event] = detector.events
    assert "3 more allocations" in event.what


# -- process groups ---------------------------------------------------------------------------


def test_new_group_is_reported_once_even_when_nested() -> None:
    public, c10d, calls = fake_dist()
    detector = ProcessGroupDetector((public, c10d))
    detector.start()
    public.new_group(ranks=[0, 1])
    public.new_subgroups(group_size=2)
    detector.stop()
    assert calls == ["new_group([0, 1])", "new_subgroups(2)", "new_group([0])", "new_group([1])"]
    assert len(detector.events) == 2
    assert "new_group(ranks=[0, 1])" in detector.events[0].what
    assert "new_subgroups(group_size=2)" in detector.events[1].what


def test_strict_sink_raises_before_the_group_is_created() -> None:
    public, c10d, calls = fake_dist()
    detector = ProcessGroupDetector((public, c10d))
    detector.start(Strict())
    with pytest.raises(LazySpecializationError, match="new_group"):
        public.new_group(ranks=[0])
    detector.stop()
    assert calls == []


def test_group_counter_catches_a_factory_bound_before_the_window() -> None:
    public, c10d, _ = fake_dist()
    bound = public.new_group  # taken before the window: the wrapper never sees it
    detector = ProcessGroupDetector((public, c10d))
    detector.start()
    bound(ranks=[0])
    detector.stop()
    [event] = detector.events
    assert "1 process group(s)" in event.what and "c10d group counter" in event.what


def test_factories_are_restored_after_the_window() -> None:
    originals = (dist.new_group, dist.new_subgroups, dist.distributed_c10d.new_group)
    detector = ProcessGroupDetector()
    detector.start()
    assert dist.new_group is not originals[0]
    assert dist.new_group is dist.distributed_c10d.new_group  # one wrapper per function
    detector.stop()
    assert (dist.new_group, dist.new_subgroups, dist.distributed_c10d.new_group) == originals
    assert detector.events == []


# -- dynamo -----------------------------------------------------------------------------------


def test_describe_compile_tells_first_compiles_from_recompiles() -> None:
    assert "first compile of frame 3" in describe_compile("3/0", "DYNAMO")
    assert "recompile #2 of frame 3" in describe_compile("3/2", "DYNAMO")
    assert "compile (compile id ?" in describe_compile("?", "unknown")


def test_dynamo_s_import_is_a_blind_spot_only_where_the_forkserver_preloaded_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Imported early by the preload, dynamo's import in a window cannot be seen (its
    compiles still can); imported by the rank itself, or not at all, nothing is blind."""
    from harness.capture.detectors import DynamoDetector
    from harness.core import preloaded
    from harness.schema.capture import DetectorStatus

    dynamo = "torch._dynamo"
    detector = DynamoDetector()
    monkeypatch.setitem(sys.modules, dynamo, SimpleNamespace())
    monkeypatch.setattr(preloaded, "_early", {})
    assert detector.blind_spots() == ()  # the rank's own import
    monkeypatch.setattr(preloaded, "_early", {"real-trees": {dynamo}})
    assert detector.blind_spots() == (
        DetectorStatus(
            name="dynamo-import",
            active=False,
            reason=(
                "torch._dynamo was imported by the forkserver's preload before this window, "
                "where a cold rank had not imported it: its lazy import in the window could not "
                "be seen (its compiles were watched)"
            ),
        ),
    )
    monkeypatch.delitem(sys.modules, dynamo)
    assert detector.blind_spots() == ()  # not imported: its import is watched


@pytest.mark.slow
def test_dynamo_reports_compiles_and_recompiles_inside_the_window_only() -> None:
    """Dynamo caches compiles by code object for the life of the process: a second run of this
    test in one process (mutmut runs pytest many times in its own) would find `double`'s
    shapes already compiled and see no recompile, so it starts from a reset dynamo."""
    import torch._dynamo

    torch._dynamo.reset()

    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    fn = torch.compile(double, backend="eager", dynamic=False)
    fn(torch.ones(2))  # compiled before the window: not lazy work
    detector = DynamoDetector()
    detector.start()
    fn(torch.ones(2))  # cached: nothing
    fn(torch.ones(3))  # recompile
    detector.stop()
    fn(torch.ones(4))  # after the window: not watched
    [event] = detector.events
    assert event.detector == "dynamo" and "recompile #1" in event.what
    assert "test_dynamo_reports_compiles" in event.stack


@pytest.fixture
def dynamo_imported() -> None:
    """The detector watches compiles through dynamo once dynamo is imported (else its import)."""
    import torch._dynamo  # noqa: F401


def test_dynamo_not_yet_imported_is_watched_for_its_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a process without dynamo the detector imports nothing and reports dynamo's import
    inside the window (a fresh interpreter doing it for real: tests/test_plugin_isolation.py)."""
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    detector = DynamoDetector()
    assert detector.status().active
    detector.start()
    watch = detector._watch
    assert "torch._dynamo" not in sys.modules and sys.meta_path[0] is watch
    detector.stop()
    assert detector.events == [] and watch not in sys.meta_path
    detector.start()
    detector.enter_phase("capture")
    sys.meta_path[0].find_spec("torch._dynamo")  # what `import torch._dynamo` asks first
    detector.stop()
    [event] = detector.events
    assert event.what.startswith("torch._dynamo imported inside the capture window")
    assert event.phase == "capture" and "test_dynamo_not_yet_imported" in event.stack


def test_dynamo_frame_counter_is_a_backstop(
    monkeypatch: pytest.MonkeyPatch, dynamo_imported: None
) -> None:
    frames = iter([10, 12])
    monkeypatch.setattr(DynamoDetector, "_frames", staticmethod(lambda: next(frames)))
    detector = DynamoDetector()
    detector.start()
    detector.stop()
    [event] = detector.events
    assert "2 frame(s)" in event.what


def test_dynamo_events_wait_for_stop_even_with_a_strict_sink(dynamo_imported: None) -> None:
    """Dynamo wraps exceptions raised in its callbacks, so the detector holds its events."""
    detector = DynamoDetector()
    sink = Strict()
    detector.start(sink)
    detector._on_start(SimpleNamespace(callback_trigger=SimpleNamespace(name="DYNAMO"),
                                       compile_id="7/1"))  # fmt: skip
    assert sink.seen == []
    with pytest.raises(LazySpecializationError, match="recompile #1 of frame 7"):
        detector.stop()
    assert not detector.running


def _miss_beside_other_dtypes(rank: int, world: int, store: str) -> None:
    with gloo_group(rank, world, store):
        registry = TransportRegistry()
        registry.get_or_create(SIG)  # warmed: bf16 queries and outputs
        fp32 = replace(SIG, dtype="fp32")
        fp8_query = replace(SIG, query_dtype="fp8_e4m3fn")
        detector = TransportRegistryDetector(registry)
        detector.start()
        assert registry.get(SIG) is not None
        assert registry.get(fp32) is None and registry.get(fp8_query) is None
        detector.stop()
        assert [e.signature for e in detector.events] == [fp32, fp8_query]
        registry.close()


def test_miss_is_reported_even_when_another_dtype_of_that_geometry_is_held() -> None:
    spawn(_miss_beside_other_dtypes, world=2)
