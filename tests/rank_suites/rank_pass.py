"""Every rank passes: collectives agree, one skip, one parametrized pair, and the session
started as the launcher and the rank plugin set it up."""

from __future__ import annotations

import gc

import pytest
import torch.distributed as dist
from _world import all_reduce_sum


def test_world_formed():
    assert dist.is_initialized()
    assert dist.get_world_size() >= 2


def test_all_reduce():
    world = dist.get_world_size()
    assert all_reduce_sum(1.0) == world


@pytest.mark.parametrize("value", [1.0, 2.5])
def test_sum_of_ranks(value):
    world = dist.get_world_size()
    assert all_reduce_sum(value * dist.get_rank()) == value * world * (world - 1) / 2


def test_no_installed_pytest_plugin_was_loaded(request):
    assert request.config.pluginmanager.list_plugin_distinfo() == []


COLLECTED_WITH_GC = gc.isenabled()


def test_the_collected_heap_is_out_of_the_collectors_reach():
    assert not COLLECTED_WITH_GC, "no collections while start-up builds the heap"
    assert gc.get_freeze_count() > 50_000  # torch and the modules alone are more
    assert gc.isenabled(), "what the tests make is collected"


def test_skipped_everywhere():
    pytest.skip("skips on every rank")


def test_barrier_last():
    dist.barrier()
