"""Fixtures for the qualification suites, which run on every rank under torchrun.

The rank plugin (`harness.rank.plugin`, registered as "dcpqual-rank") initializes the process
group before collection and provides `rank_plan` (what `dcpqual run` asked for), `world` and
`record_capture`; these fixtures build on them. A developer launching torchrun by hand passes
`-p harness.rank.plugin` too (the plan's defaults apply without `DCPQUAL_PLAN`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch.distributed as dist

from harness.capture.check import ranks_failing_each
from harness.core.geometry import ParallelGeometry
from harness.models.builders import CONTRAST_DCP_SIZES, CONTRAST_TP
from harness.rank.fixtures import World, plan_of
from harness.schema.plan import RankPlan
from harness.schema.rank_record import RankUse


@pytest.hookimpl(optionalhook=True)
def pytest_dcpqual_rank_use() -> RankUse:
    """For the rank plugin (as the repository's root conftest answers it): the transports this
    rank created and the vLLM trees it built, also where these suites run from an installed
    wheel without the checkout's root conftest."""
    from harness.use import rank_use

    return rank_use()


# Group sizes created together, on the first request for any group: sub-world cases of
# different sizes run at the same time on different ranks (the rank plugin's lanes), and
# creating a group is collective over the whole world, so no lane may create one on its own.
SUBGROUP_SIZES = (2, 4)  # the sub-world sizes of the suites (transport: DCP 2 and 4)


@pytest.fixture(scope="session")
def subgroups(world: World) -> Callable[[int], dist.ProcessGroup]:
    """`subgroups(n)` -> this rank's group of n consecutive ranks (created once per size).

    The first request creates the groups of every size in `SUBGROUP_SIZES` that splits the
    world, in that order, on every rank; any other size is created when first asked for, so
    every rank must ask for it in the same order (identical test order guarantees that) and
    never from a sub-world case.
    """
    cache: dict[int, dist.ProcessGroup] = {}

    def create(size: int) -> None:
        cache[size] = dist.new_subgroups(group_size=size)[0]

    def get(size: int) -> dist.ProcessGroup:
        if world.size % size:
            pytest.skip(f"world size {world.size} cannot be split into groups of {size}")
        if not cache:
            for standard in SUBGROUP_SIZES:
                if standard < world.size and world.size % standard == 0:
                    create(standard)
        if size not in cache:
            create(size)
        return cache[size]

    return get


@dataclass(frozen=True)
class Qualification:
    """The geometry a run qualifies, and this rank's DCP group for it.

    tp and dcp come from `dcpqual run --tp/--dcp` (the rank plan); by default
    tp=16 and dcp = min(world size, 16), so 16 ranks qualify Kimi-K3 TP16/DCP16 and smaller
    test runs keep a real, smaller DCP group (e.g. 4 ranks: TP16/DCP4).
    """

    geometry: ParallelGeometry
    dcp_group: dist.ProcessGroup

    @property
    def tp(self) -> int:
        return self.geometry.tp

    @property
    def dcp(self) -> int:
        return self.geometry.dcp


@pytest.fixture(scope="session")
def qualification(
    world: World, subgroups: Callable[[int], dist.ProcessGroup], rank_plan: RankPlan
) -> Qualification:
    tp, dcp = rank_plan.tp, rank_plan.resolved_dcp(world.size)
    geometry = ParallelGeometry(tp=tp, dcp=dcp)
    if world.size % dcp:
        pytest.fail(f"world size {world.size} cannot be split into DCP groups of {dcp}")
    group = dist.group.WORLD if dcp == world.size else subgroups(dcp)
    return Qualification(geometry=geometry, dcp_group=group)


HELD_OUT_DCP_SIZES = (4, 2)


@pytest.fixture(scope="session")
def held_out(
    world: World, qualification: Qualification, subgroups: Callable[[int], dist.ProcessGroup]
) -> Qualification:
    """A second geometry on the same ranks, beside the one the run qualifies: the same tp, and
    a DCP group that is a proper subgroup of the world with dcp != tp (TP16/DCP4 beside
    TP16/DCP16 on 16 ranks; TP16/DCP2 on 4). A warm that ignores its DCP group or reads local
    heads as num_heads // dcp passes wherever the DCP group is the world and tp == dcp."""
    tp = qualification.tp
    for dcp in HELD_OUT_DCP_SIZES:
        if dcp in (qualification.dcp, tp) or tp % dcp or world.size % dcp or dcp >= world.size:
            continue
        return Qualification(geometry=ParallelGeometry(tp=tp, dcp=dcp), dcp_group=subgroups(dcp))
    pytest.skip(
        f"no held-out geometry at tp={tp} on {world.size} ranks: needs dcp in "
        f"{HELD_OUT_DCP_SIZES}, a proper divisor of the world size, other than tp and "
        f"dcp={qualification.dcp}"
    )


@pytest.fixture(scope="session")
def contrast(
    world: World, qualification: Qualification, subgroups: Callable[[int], dist.ProcessGroup]
) -> Qualification:
    """Where the contrast tree runs (`harness.models.builders.build_contrasts`: layers at TP16,
    TP8 and TP4, so dcp is 2 or 4): the run's DCP group where its size is one of those (2 ranks:
    DCP2; 4 ranks: DCP4), else groups of 4 or 2 on the same ranks (16 ranks: DCP4)."""
    if qualification.dcp in CONTRAST_DCP_SIZES:
        geometry = ParallelGeometry(tp=CONTRAST_TP, dcp=qualification.dcp)
        return Qualification(geometry=geometry, dcp_group=qualification.dcp_group)
    for dcp in sorted(CONTRAST_DCP_SIZES, reverse=True):
        if dcp <= world.size and world.size % dcp == 0:
            group = dist.group.WORLD if dcp == world.size else subgroups(dcp)
            return Qualification(ParallelGeometry(tp=CONTRAST_TP, dcp=dcp), dcp_group=group)
    pytest.skip(
        f"the contrast tree needs dcp in {CONTRAST_DCP_SIZES}; "
        f"{world.size} ranks split into neither"
    )


@pytest.fixture(scope="session")
def warm_impl_name(rank_plan: RankPlan) -> str:
    """Which warm implementation the run qualifies (`dcpqual run --warm-impl`)."""
    return rank_plan.warm_impl


@pytest.fixture
def agree_all(world) -> Callable[..., None]:
    """`agree_all((ok, what), ...)`: every rank contributes its verdict on each check, all in one
    collective; all ranks fail, on the first check that failed anywhere, unless all passed."""

    def check(*checks: tuple[bool, str]) -> None:
        each = ranks_failing_each([ok for ok, _ in checks], device=world.device)
        for (_, what), failing in zip(checks, each, strict=True):
            if failing:
                pytest.fail(f"{what}: failed on rank(s) {list(failing)} of {world.size}")

    return check


@pytest.fixture
def agree(agree_all) -> Callable[[bool, str], None]:
    """`agree(ok, what)`: every rank contributes its verdict; all fail unless all passed."""

    def check(ok: bool, what: str) -> None:
        agree_all((ok, what))

    return check


# Which model sources a run qualifies (`dcpqual run --models`): stand-in trees, vLLM's real
# trees, both, or vLLM's own engine (the engine lane, alone or beside the stand-ins). Tests of
# the other sources are deselected, identically on every rank.
MODEL_SOURCES = {
    "stand-in": ("stand-in",),
    "real": ("real",),
    "both": ("stand-in", "real"),
    "engine": ("engine",),
    "stand-in,engine": ("stand-in", "engine"),
}
STAND_IN_SUITES = ("suites/warmup/", "suites/capture/")
REAL_SUITES = ("suites/real/",)
ENGINE_SUITES = ("suites/engine/",)


# Suites that run before the others, in collection order otherwise (identical on every rank).
# The transport's own checks need no model and no warm implementation: a broken transport stops
# the run before the checks built on it, and the capture suite's off-rank control process
# (started when collection ends) finishes in the background meanwhile instead of being waited
# for. The capture suite still runs its negative controls before its capture checks.
FIRST_SUITES = ("suites/transport/",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(FIRST_SUITES))  # stable
    chosen = MODEL_SOURCES[plan_of(config).models]
    dropped_prefixes = [
        *(() if "stand-in" in chosen else STAND_IN_SUITES),
        *(() if "real" in chosen else REAL_SUITES),
        *(() if "engine" in chosen else ENGINE_SUITES),
    ]
    if not dropped_prefixes:
        return
    kept, dropped = [], []
    for item in items:
        target = dropped if item.nodeid.startswith(tuple(dropped_prefixes)) else kept
        target.append(item)
    if dropped:
        plugin = config.pluginmanager.get_plugin("dcpqual-rank")
        if plugin is not None:  # not the user's narrowing: the evidence must not call it one
            plugin.left_out_by_model_source(dropped)
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
