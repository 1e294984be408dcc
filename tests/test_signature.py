"""TransportSignature: validated at birth, hashable, ordered, JSON round-trip."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import get_args

import pytest
import torch
from pydantic import ValidationError

from harness.core.signature import (
    COMM_BACKENDS,
    DEVICE_TYPES,
    OUTPUT_DTYPES,
    QUERY_DTYPES,
    TransportSignature,
)
from harness.errors import GeometryError, UsageError
from harness.schema.signature import (
    CommBackend,
    DeviceType,
    OutputDtype,
    QueryDtype,
    SignatureJson,
)
from harness.transport.dtypes import dtype_name, output_torch_dtype, query_torch_dtype, wire_dtype

KIMI = dict(
    dtype="bf16", total_heads=96, query_head_dim=576, output_head_dim=512, dcp_world_size=16
)


def test_kimi_signature_derives_six_local_heads():
    sig = TransportSignature(**KIMI)
    assert sig.local_heads == 6
    assert query_torch_dtype(sig) is output_torch_dtype(sig) is torch.bfloat16
    assert "96 heads x 576 -> 512" in sig.describe()


def test_equal_signatures_hash_equal_and_dedupe_in_a_set():
    assert len({TransportSignature(**KIMI), TransportSignature(**KIMI)}) == 1


def test_json_round_trip_keeps_every_field():
    sig = TransportSignature(**KIMI, max_tokens=8192, device_type="cuda")
    data = json.loads(json.dumps(sig.to_json()))
    assert data["local_heads"] == 6
    assert SignatureJson.read(data) == sig


def test_the_writer_writes_exactly_the_models_fields_and_choices():
    """`to_json` (core) and `SignatureJson` (schema) describe one format: the same keys in the
    same order, the same defaults, the same allowed values."""
    written = list(TransportSignature(**KIMI).to_json())
    assert written == [k for k in SignatureJson.model_fields if k != "output_dtype"]
    defaults = {f.name: f.default for f in dataclasses.fields(TransportSignature)}
    for name, field in SignatureJson.model_fields.items():
        if not field.is_required() and name in defaults:
            assert field.default == defaults[name], name
    assert get_args(OutputDtype) == OUTPUT_DTYPES and get_args(QueryDtype) == QUERY_DTYPES
    assert get_args(CommBackend) == COMM_BACKENDS and get_args(DeviceType) == DEVICE_TYPES


def test_reading_refuses_inconsistent_local_heads():
    data = TransportSignature(**KIMI).to_json() | {"local_heads": 5}
    with pytest.raises(ValidationError, match="local_heads=5 does not match"):
        SignatureJson.read(data)


def test_reading_names_missing_fields_and_refuses_unknown_ones():
    with pytest.raises(ValidationError, match="total_heads\n  Field required"):
        SignatureJson.read({"dtype": "bf16"})
    with pytest.raises(ValidationError, match="heads\n  Extra inputs are not permitted"):
        SignatureJson.read(TransportSignature(**KIMI).to_json() | {"heads": 96})


def test_reading_refuses_a_geometry_the_signature_cannot_have():
    with pytest.raises(ValidationError, match="total_heads=90 is not divisible"):
        SignatureJson.read(TransportSignature(**KIMI).to_json() | {"total_heads": 90})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"total_heads": 0}, "total_heads must be a positive integer, got 0"),
        ({"dcp_world_size": -2}, "dcp_world_size must be a positive integer, got -2"),
        ({"total_heads": 90}, "total_heads=90 is not divisible by dcp_world_size=16"),
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"device_type": "tpu"}, "device_type"),
        ({"query_head_dim": True}, "query_head_dim"),
    ],
)
def test_invalid_signatures_name_the_offending_value(change, message):
    with pytest.raises(GeometryError, match=message):
        TransportSignature(**(KIMI | change))


def test_unknown_dtype_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown dtype 'int8'"):
        TransportSignature(**(KIMI | {"dtype": "int8"}))


def test_dtype_names_cover_torch_dtypes():
    assert dtype_name(torch.float16) == "fp16"
    with pytest.raises(UsageError):
        dtype_name(torch.int8)


def test_sort_order_is_deterministic():
    a = TransportSignature(**KIMI)
    b = TransportSignature(**(KIMI | {"total_heads": 128, "query_head_dim": 512}))
    assert sorted([b, a]) == [a, b]


def test_query_dtype_defaults_to_the_output_dtype_and_compares_equal():
    spelled = TransportSignature(**KIMI, query_dtype="bf16")
    assert spelled == TransportSignature(**KIMI) and spelled.query_dtype == "bf16"
    assert spelled.output_dtype == spelled.dtype == "bf16"


def test_fp8_query_is_its_own_signature_and_says_so():
    fp8 = TransportSignature(**KIMI, query_dtype="fp8_e4m3fn")
    assert fp8 != TransportSignature(**KIMI)
    assert query_torch_dtype(fp8) is torch.float8_e4m3fn
    assert output_torch_dtype(fp8) is torch.bfloat16
    assert "(fp8_e4m3fn -> bf16, dcp=16" in fp8.describe()
    assert dtype_name(torch.float8_e4m3fn) == "fp8_e4m3fn"


def test_fp8_is_not_an_output_dtype():
    with pytest.raises(UsageError, match="unknown dtype 'fp8_e4m3fn'"):
        TransportSignature(**(KIMI | {"dtype": "fp8_e4m3fn"}))


def test_comm_backend_is_part_of_the_identity():
    a2a = TransportSignature(**KIMI, comm_backend="a2a")
    assert a2a != TransportSignature(**KIMI) and a2a.describe().endswith(", a2a)")
    assert TransportSignature(**KIMI).comm_backend == "ag_rs"
    with pytest.raises(GeometryError, match="comm_backend must be one of"):
        TransportSignature(**KIMI, comm_backend="nccl")


def test_json_adds_fields_and_reads_the_older_form():
    data = TransportSignature(**KIMI, query_dtype="fp8_e4m3fn", comm_backend="a2a").to_json()
    assert data["dtype"] == "bf16" and data["query_dtype"] == "fp8_e4m3fn"
    assert data["comm_backend"] == "a2a"
    assert SignatureJson.read(data).query_dtype == "fp8_e4m3fn"
    older = dict(KIMI, max_tokens=64, device_type="cpu", local_heads=6)
    assert SignatureJson.read(older) == TransportSignature(**KIMI)
    with pytest.raises(ValidationError, match="output_dtype='fp16' does not match"):
        SignatureJson.read(older | {"output_dtype": "fp16"})


def test_core_vocabulary_imports_without_torch():
    code = (
        "import sys, harness.core.signature, harness.core.geometry; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_dtype_names_are_checked_when_given_as_names():
    assert dtype_name("fp16") == "fp16"
    with pytest.raises(UsageError, match="unknown dtype 'int8'"):
        dtype_name("int8")


def test_an_unsupported_torch_dtype_names_itself_and_the_supported_ones():
    with pytest.raises(UsageError) as raised:
        dtype_name(torch.int8)
    assert str(raised.value) == (
        "unsupported dtype torch.int8; expected one of ['bf16', 'fp16', 'fp32', 'fp8_e4m3fn']"
    )


@pytest.mark.parametrize(
    "dtype, wire",
    [
        (torch.float8_e4m3fn, torch.uint8),  # gloo has no fp8: its bytes travel
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.float32, torch.float32),
        (torch.int8, torch.int8),  # one byte, but not a float: moves as itself
        (torch.uint8, torch.uint8),
    ],
)
def test_only_one_byte_floats_travel_as_bytes(dtype, wire):
    assert wire_dtype(dtype) is wire


def test_fp8_round_trips_bit_exact_through_its_wire_dtype():
    values = torch.tensor([0.0, -0.0, 1.5, -448.0, float("nan")]).to(torch.float8_e4m3fn)
    back = values.view(wire_dtype(values.dtype)).clone().view(torch.float8_e4m3fn)
    assert torch.equal(back.view(torch.uint8), values.view(torch.uint8))
