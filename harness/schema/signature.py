"""The transport signature on disk, and the rows `dcpqual signatures --json` prints.

`TransportSignature` (harness.core) is the value the code passes around; `SignatureJson` is its
JSON form with every field named, so a record or receipt that carries one is checked key by key.
`SignatureField` is the annotated type a model uses for a signature field: it validates through
`SignatureJson`, holds a `TransportSignature`, and dumps with `TransportSignature.to_json`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PlainSerializer,
    PlainValidator,
    PositiveInt,
    RootModel,
    WithJsonSchema,
)

from harness.core.signature import TransportSignature
from harness.schema.base import Model

OutputDtype = Literal["bf16", "fp16", "fp32"]
QueryDtype = Literal["bf16", "fp16", "fp32", "fp8_e4m3fn"]
CommBackend = Literal["ag_rs", "a2a"]
DeviceType = Literal["cpu", "cuda"]


class SignatureJson(Model):
    """One DCP transport as JSON (schema "dcpqual-signature/v1"; fields only added since).

    `query_dtype` absent means the same as `dtype` (JSON written before the split);
    `local_heads` and `output_dtype` are derived and, when present, must agree."""

    dtype: OutputDtype
    total_heads: PositiveInt
    query_head_dim: PositiveInt
    output_head_dim: PositiveInt
    dcp_world_size: PositiveInt
    max_tokens: PositiveInt = 64
    device_type: DeviceType = "cpu"
    query_dtype: QueryDtype | None = None
    comm_backend: CommBackend = "ag_rs"
    local_heads: PositiveInt | None = None
    output_dtype: OutputDtype | None = None

    def value(self) -> TransportSignature:
        """The signature, with the derived fields checked (UsageError/GeometryError)."""
        return TransportSignature.from_json(self.model_dump(exclude_none=True))


def _validate(data: object) -> TransportSignature:
    if isinstance(data, TransportSignature):
        return data
    return SignatureJson.model_validate(data).value()


def _dump(sig: TransportSignature) -> dict[str, Any]:
    return sig.to_json()


SignatureField = Annotated[
    TransportSignature,
    PlainValidator(_validate),
    PlainSerializer(_dump, return_type=dict),
    WithJsonSchema(SignatureJson.model_json_schema()),
]


RowSource = Literal["stand-in", "real"]


class SignatureListRow(SignatureJson):
    """One row of `dcpqual signatures --json`: the signature, the model it came from, the layer
    kinds that asked for it and how many layers did; `source` "real" for vLLM's own tree."""

    model: str = Field(min_length=1)
    kinds: list[str]
    layers: PositiveInt
    source: RowSource | None = None


class SignatureList(RootModel[list[SignatureListRow]]):
    """What `dcpqual signatures --json` prints: one row per distinct signature."""

    def dumps(self) -> str:
        """The printed text: every row checked against the model first."""
        return json.dumps(self.model_dump(mode="json", exclude_none=True), indent=2)
