"""The transport signature on disk, and the rows `dcpqual signatures --json` prints.

`TransportSignature` (harness.core) is the value the code passes around; `SignatureJson` is its
JSON form with every field named, and the one reader of it: a record, receipt or warm report
that carries one is checked key by key, and the derived fields against the value. The writer is
`TransportSignature.to_json` (torch- and pydantic-free, so the vendored warm code and the bare
rank can write one); a test pins that what it writes is exactly what this model reads.
`SignatureField` is the annotated type a model uses for a signature field: it validates through
`SignatureJson`, holds a `TransportSignature`, and dumps with `TransportSignature.to_json`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any, Literal, Self

from pydantic import (
    Field,
    PlainSerializer,
    PlainValidator,
    PositiveInt,
    PrivateAttr,
    RootModel,
    WithJsonSchema,
    model_validator,
)

from harness.core.signature import (
    DEFAULT_COMM_BACKEND,
    DEFAULT_MAX_TOKENS,
    TransportSignature,
)
from harness.errors import UsageError
from harness.schema.base import Model

OutputDtype = Literal["bf16", "fp16", "fp32"]
QueryDtype = Literal["bf16", "fp16", "fp32", "fp8_e4m3fn"]
CommBackend = Literal["ag_rs", "a2a"]
DeviceType = Literal["cpu", "cuda"]
_FIELDS = {f.name for f in dataclasses.fields(TransportSignature)}


class SignatureJson(Model):
    """One DCP transport as JSON (schema "dcpqual-signature/v1"; fields only added since).

    `query_dtype` absent means the same as `dtype` (JSON written before the split);
    `local_heads` and `output_dtype` are derived and, when present, must agree."""

    dtype: OutputDtype
    total_heads: PositiveInt
    query_head_dim: PositiveInt
    output_head_dim: PositiveInt
    dcp_world_size: PositiveInt
    max_tokens: PositiveInt = DEFAULT_MAX_TOKENS
    device_type: DeviceType = "cpu"
    query_dtype: QueryDtype | None = None
    comm_backend: CommBackend = DEFAULT_COMM_BACKEND
    local_heads: PositiveInt | None = None
    output_dtype: OutputDtype | None = None

    _value: TransportSignature = PrivateAttr()

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        """A geometry the signature cannot have, or a derived field that disagrees with it, is
        refused (the GeometryError/UsageError text inside the ValidationError)."""
        sig = TransportSignature(**self.model_dump(include=_FIELDS, exclude_none=True))
        if self.local_heads is not None and self.local_heads != sig.local_heads:
            raise UsageError(
                f"transport signature local_heads={self.local_heads} does not match "
                f"total_heads/dcp_world_size={sig.local_heads}"
            )
        if self.output_dtype is not None and self.output_dtype != sig.dtype:
            raise UsageError(
                f"transport signature output_dtype={self.output_dtype!r} does not match "
                f"dtype={sig.dtype!r} (dtype is the output dtype)"
            )
        self._value = sig
        return self

    def value(self) -> TransportSignature:
        """The signature this JSON names."""
        return self._value

    @classmethod
    def read(cls, data: object) -> TransportSignature:
        """The signature in `data` (a JSON object), checked by the model."""
        return cls.model_validate(data).value()


def _validate(data: object) -> TransportSignature:
    if isinstance(data, TransportSignature):
        return data
    return SignatureJson.read(data)


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
