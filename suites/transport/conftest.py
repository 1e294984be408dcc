"""Fixtures of the transport suite: one registry per reduction implementation, DCP groups.

Every rank runs the same tests in the same order; transports are created on first use inside a
test (collective over that test's DCP group) and fetched locally by later tests of the session
(`transports`).
Geometries and implementations live in `harness.transport.testing` (shared with unit tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch.distributed as dist

from harness.transport.registry import TransportRegistry
from harness.transport.testing import IMPLS, SuiteTransports


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A case that takes `dcp_group` and a `dcp` parameter runs its collectives on groups of
    dcp ranks only: marked `subworld(size=dcp)`, the rank plugin may place it on a part of
    the world beside the cases of the other sizes."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "dcp_group" in getattr(item, "fixturenames", ()) and "dcp" in params:
            item.add_marker(pytest.mark.subworld(size=int(params["dcp"])))


@pytest.fixture(scope="session")
def registries(world) -> Iterator[dict[str, TransportRegistry]]:
    """name -> registry, one per reduction implementation (see `IMPLS`)."""
    made = {
        name: TransportRegistry(strategy=strategy, reduce_scatter=rs, device=world.device)
        for name, (strategy, rs) in IMPLS.items()
    }
    yield made
    for registry in made.values():
        registry.close()


@pytest.fixture(scope="session")
def transports(registries) -> SuiteTransports:
    """`transports.get(impl, signature, group)`: created collectively on the session's first
    request, a local lookup after (see `SuiteTransports`)."""
    return SuiteTransports(registries)


@dataclass(frozen=True)
class Group:
    """This rank's DCP group of `size` consecutive ranks, and its rank inside it."""

    group: dist.ProcessGroup
    size: int
    rank: int


@pytest.fixture(scope="session")
def dcp_group(subgroups) -> Callable[[int], Group]:
    """`dcp_group(n)`: this rank's group of n consecutive ranks (skips if the world can't)."""

    def get(size: int) -> Group:
        group = subgroups(size)
        return Group(group=group, size=size, rank=dist.get_rank(group))

    return get
