"""The registry of on-disk formats: `SCHEMAS` names each format's JSON Schema.

`dcpqual schema NAME` prints it; the committed copies live under `schemas/NAME.json`, and a test
keeps them equal to what the models generate, so other tools can validate a bundle's files
without this package.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.schema.base import adapter_of


@dataclass(frozen=True)
class SchemaSpec:
    """One format: its versioned id, what it is, and how to build its JSON Schema."""

    id: str
    what: str
    build: Callable[[], dict[str, Any]]


def _receipt() -> dict[str, Any]:
    from harness.schema.receipt import Receipt

    return Receipt.model_json_schema(by_alias=True, mode="serialization")


def _rank_record() -> dict[str, Any]:
    from harness.schema.rank_record import RankRecord

    return adapter_of(RankRecord).json_schema(mode="serialization")


def _source_lock() -> dict[str, Any]:
    from harness.schema.lock import SourceLock

    return SourceLock.model_json_schema(by_alias=True, mode="serialization")


def _rank_plan() -> dict[str, Any]:
    from harness.schema.plan import RankPlan

    return RankPlan.model_json_schema(by_alias=True, mode="serialization")


def _signature() -> dict[str, Any]:
    from harness.schema.signature import SignatureJson

    return SignatureJson.model_json_schema(mode="serialization")


def _signatures() -> dict[str, Any]:
    from harness.schema.signature import SignatureList

    return SignatureList.model_json_schema(mode="serialization")


def _bench() -> dict[str, Any]:
    from harness.schema.bench import BenchReport

    return BenchReport.model_json_schema(by_alias=True, mode="serialization")


def _node_marker() -> dict[str, Any]:
    from harness.schema.launch import NodeState

    return NodeState.model_json_schema(mode="serialization")


def _image_identity() -> dict[str, Any]:
    from harness.schema.image import ImageIdentity

    return ImageIdentity.model_json_schema(by_alias=True, mode="serialization")


def _smoke_result() -> dict[str, Any]:
    from harness.schema.smoke import SmokeResult

    return adapter_of(SmokeResult).json_schema(mode="serialization")


SCHEMAS: dict[str, SchemaSpec] = {
    "receipt": SchemaSpec("dcpqual-receipt/v1", "an evidence bundle's receipt.json", _receipt),
    "rank-record": SchemaSpec(
        "dcpqual-rank-record/v1", "a bundle's records/rank-NN.json", _rank_record
    ),
    "rank-plan": SchemaSpec(
        "dcpqual-rank-plan/v1", "what every rank runs with ($DCPQUAL_PLAN)", _rank_plan
    ),
    "source-lock": SchemaSpec(
        "dcpqual-source-lock/v1", "an image's source.lock.json", _source_lock
    ),
    "signature": SchemaSpec("dcpqual-signature/v1", "one DCP transport signature", _signature),
    "signatures": SchemaSpec(
        "dcpqual-signatures/v1", "what `dcpqual signatures --json` prints", _signatures
    ),
    "bench": SchemaSpec("dcpqual-bench/v1", "what `dcpqual bench --out FILE` writes", _bench),
    "image-identity": SchemaSpec(
        "dcpqual-image-identity/v1", "an image build's identity.json", _image_identity
    ),
    "node-marker": SchemaSpec(
        "dcpqual-node-marker/v1", "a multi-node run's nodes/node-KK.json", _node_marker
    ),
    "smoke-result": SchemaSpec(
        "dcpqual-smoke-result/v1", "a GPU smoke bundle's smoke/result.json", _smoke_result
    ),
}


def schema_text(name: str) -> str:
    """The JSON Schema of format `name`, as committed under schemas/ (stable text)."""
    spec = SCHEMAS[name]
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": spec.id,
        "description": f"{spec.id}: {spec.what}",
        **spec.build(),
    }
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
