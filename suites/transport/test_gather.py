"""Query gather over 2, 4 and 16 ranks: bit-exact, rank-major, nothing misrouted."""

from __future__ import annotations

import pytest
import torch

from harness.transport.testing import (
    DCP_SIZES,
    MODELS,
    SUITE_MAX_TOKENS,
    bit_equal,
    expected_gather,
    make_queries,
)
from harness.warm.signature import query_torch_dtype


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_gather_is_bit_exact(dcp, model, dtype, dcp_group, transports, world) -> None:
    group = dcp_group(dcp)
    spec = MODELS[model]
    sig = spec.signature(dtype, dcp, world.device.type)
    transport = transports.get("ag_rs", sig, group.group)
    for batch in (1, SUITE_MAX_TOKENS):
        queries = make_queries(
            dcp, batch, spec.local_heads, spec.query_head_dim, query_torch_dtype(sig), seed=batch
        )
        got = transport.gather_queries(queries[group.rank].to(world.device)).cpu()
        assert got.shape == (batch, sig.total_heads, spec.query_head_dim)
        assert bit_equal(got, expected_gather(queries)), f"batch {batch}"
        # Encoded channels: head block r comes from rank r, heads in global order, tokens kept.
        heads = torch.arange(sig.total_heads, dtype=torch.float32)
        assert torch.equal(got[0, :, 0].float(), heads // spec.local_heads + 1)
        assert torch.equal(got[0, :, 1].float(), heads + 1)
        assert torch.equal(got[:, 0, 2].float(), torch.arange(batch, dtype=torch.float32) + 1)


@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_gather_into_out_and_same_result_twice(dcp, dcp_group, transports, world) -> None:
    group = dcp_group(dcp)
    sig = MODELS["kimi-k3"].signature("bf16", dcp, world.device.type)
    transport = transports.get("a2a", sig, group.group)
    queries = make_queries(
        dcp, 3, sig.local_heads, sig.query_head_dim, query_torch_dtype(sig), seed=5
    )
    mine = queries[group.rank].to(world.device)
    first = transport.gather_queries(mine)
    out = torch.empty_like(first)
    second = transport.gather_queries(mine, out=out)
    assert second is out
    assert bit_equal(first, second)
