"""Stand-ins for what the capture detectors watch, so a test can make each kind of lazy work
happen on demand in one process: a strict sink, a registry whose events and counters the test
moves by hand, and `torch.distributed` modules whose group factories only count."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from harness.capture.events import LazyEvent, LazySpecializationError
from harness.transport.events import RegistryCounters


class Strict:
    """A sink that raises like a strict window."""

    def __init__(self) -> None:
        self.seen: list[LazyEvent] = []

    def __call__(self, event: LazyEvent) -> None:
        self.seen.append(event)
        raise LazySpecializationError(event)


class Recording:
    """A sink that only keeps what it was handed (a lenient window)."""

    def __init__(self) -> None:
        self.seen: list[LazyEvent] = []

    def __call__(self, event: LazyEvent) -> None:
        self.seen.append(event)


class FakeRegistry:
    """Delivers whatever events a test emits, with counters the test moves by hand."""

    def __init__(self) -> None:
        self.subscribers: list[Any] = []
        self.counters = RegistryCounters()

    def subscribe(self, callback: Any) -> Any:
        self.subscribers.append(callback)
        return lambda: self.subscribers.remove(callback)

    def emit(self, event: object) -> None:
        for callback in tuple(self.subscribers):
            callback(event)


# c10d's world before the window: groups already made, so a count read from the wrong world
# (the real one, which has none in a test process) shows.
GROUPS_BEFORE = 3
HELD_BEFORE = 2


def fake_dist() -> tuple[SimpleNamespace, SimpleNamespace, list[str]]:
    """(public module, c10d module with its `_world`, the factory calls made).

    `new_group` names a group (the counter moves); `local_group` is one that only enters the
    map, like a locally synchronized group; `split_group` is there without
    `new_subgroups_by_enumeration`, which a torch build may lack.
    """
    calls: list[str] = []
    world = SimpleNamespace(
        group_count=GROUPS_BEFORE, pg_map={f"old{i}": i for i in range(HELD_BEFORE)}
    )

    def new_group(ranks: Any = None, *args: Any, **kwargs: Any) -> str:
        calls.append(f"new_group({ranks})")
        world.group_count += 1
        return "group"

    def new_subgroups(group_size: int, **kwargs: Any) -> tuple[str, list[str]]:
        calls.append(f"new_subgroups({group_size})")
        return c10d.new_group([0]), [c10d.new_group([1])]

    def split_group(**kwargs: Any) -> str:
        calls.append("split_group")
        world.group_count += 1
        return "split"

    def local_group(name: str) -> None:
        world.pg_map[name] = len(world.pg_map)

    factories = {"new_group": new_group, "new_subgroups": new_subgroups, "split_group": split_group}
    c10d = SimpleNamespace(_world=world, local_group=local_group, **factories)
    public = SimpleNamespace(**factories)
    return public, c10d, calls
