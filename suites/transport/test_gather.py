"""Query gather over 2, 4 and 16 ranks: bit-exact, rank-major, nothing misrouted."""

from __future__ import annotations

import pytest
import torch

from harness.core.signature import TransportSignature
from harness.transport.dtypes import query_torch_dtype
from harness.transport.testing import (
    DCP_SIZES,
    MODELS,
    SUITE_MAX_TOKENS,
    bit_equal,
    expected_gather,
    make_queries,
)


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


# The fork's fp8 query records: Kimi-K3's 576-byte e4m3 queries under a quantized KV cache, and
# the 656-byte `fp8_ds_mla` records (512 fp8 latent bytes, 16 of scales, 128 of bf16 rope); the
# fork's gather needs each record 16-byte aligned.
FP8_RECORD_BYTES = (576, 656)
RECORD_ALIGNMENT = 16


@pytest.mark.parametrize("record", FP8_RECORD_BYTES)
@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_fp8_records_gather_bit_exact_and_16_byte_aligned(
    dcp, record, dcp_group, transports, world
) -> None:
    group = dcp_group(dcp)
    local = MODELS["kimi-k3"].local_heads
    sig = TransportSignature(
        "bf16",
        local * dcp,
        record,
        512,
        dcp,
        max_tokens=SUITE_MAX_TOKENS,
        device_type=world.device.type,
        query_dtype="fp8_e4m3fn",
    )
    fp8 = query_torch_dtype(sig)
    assert fp8.itemsize * record % RECORD_ALIGNMENT == 0
    transport = transports.get("ag_rs", sig, group.group)
    for batch in (1, SUITE_MAX_TOKENS):
        queries = make_queries(dcp, batch, local, record, fp8, seed=70 + batch)
        mine = queries[group.rank].to(world.device)
        got = transport.gather_queries(mine)
        assert got.dtype == fp8 and got.shape == (batch, local * dcp, record)
        # every record of the result starts on a 16-byte boundary, as the fork's gather needs
        assert got.is_contiguous() and got.data_ptr() % RECORD_ALIGNMENT == 0
        assert got.stride(1) * got.element_size() % RECORD_ALIGNMENT == 0
        assert bit_equal(got.cpu(), expected_gather(queries)), f"batch {batch}"
