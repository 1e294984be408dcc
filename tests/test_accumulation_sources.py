"""The A2A accumulations count every source rank: partials and weights that disagree on how
many sources there are are refused, never summed over the shorter of the two (which would
drop one rank's partial from every head of the result without a trace)."""

from __future__ import annotations

import pytest
import torch

from harness.transport.combine import StagedAccumulation, accumulate_into

WORLD, BATCH, HEADS, DIM = 4, 2, 3, 8


def received(world: int = WORLD) -> torch.Tensor:
    """The partials `[W, B, h, D]` one rank receives (fp32, as wide as the accumulator, so one
    int32 mask fits both)."""
    gen = torch.Generator().manual_seed(world)
    return torch.randn(world, BATCH, HEADS, DIM, generator=gen)


def weights_for(sources: int) -> torch.Tensor:
    """Positive weights `[sources, B, h]`, summing to 1 over the sources."""
    return torch.full((sources, BATCH, HEADS), 1.0 / sources)


@pytest.mark.parametrize("sources", [WORLD - 1, WORLD + 1], ids=["one-fewer", "one-more"])
def test_accumulate_into_refuses_weights_for_another_number_of_sources(sources: int) -> None:
    with pytest.raises(ValueError, match=r"zip\(\) argument"):
        accumulate_into(torch.zeros(BATCH, HEADS, DIM), received(), weights_for(sources))


def test_accumulate_into_sums_every_source_when_the_counts_agree() -> None:
    """The control: the same call with one weight per source is the mean of the partials."""
    outputs = received()
    got = accumulate_into(torch.zeros(BATCH, HEADS, DIM), outputs, weights_for(WORLD))
    assert torch.allclose(got, outputs.mean(dim=0), rtol=1e-6, atol=1e-6)


def staging(weight_rows: int, group: int) -> StagedAccumulation:
    acc = torch.empty(BATCH, HEADS, DIM)
    return StagedAccumulation(
        acc,
        received(),
        weights=torch.empty(weight_rows, BATCH, HEADS),
        keep=torch.empty(WORLD, BATCH, HEADS, dtype=torch.int32),
        scratch=torch.empty(min(group, WORLD) * acc.numel()),
        group=group,
    )


@pytest.mark.parametrize("group", [1, 2, 3, WORLD])
def test_a_staging_whose_weights_miss_a_source_is_refused_when_built(group: int) -> None:
    with pytest.raises(ValueError, match=r"zip\(\) argument"):
        staging(WORLD - 1, group)


@pytest.mark.parametrize("group", [1, 2, 3, WORLD])
def test_a_staging_with_a_weight_per_source_sums_every_source(group: int) -> None:
    """The control: built with one weight row per source, it is the mean of the partials."""
    got = staging(WORLD, group)(weights_for(WORLD))
    assert torch.allclose(got, received().mean(dim=0), rtol=1e-6, atol=1e-6)
