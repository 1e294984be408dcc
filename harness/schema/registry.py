"""The registry of on-disk formats: `SCHEMAS` names each format's JSON Schema.

`dcpqual schema NAME` prints it; the committed copies live under `schemas/NAME.json`, and a test
keeps them equal to what the models generate, so other tools can validate a bundle's files
without this package.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Any

from harness.schema.base import adapter_of


@dataclass(frozen=True)
class SchemaSpec:
    """One format: its versioned id, what it is, and its model as "module:Class" (imported only
    when its schema is asked for, so the registry costs no model imports)."""

    id: str
    what: str
    model: str

    def build(self) -> dict[str, Any]:
        module, _, name = self.model.partition(":")
        cls = getattr(importlib.import_module(module), name)
        return dict(adapter_of(cls).json_schema(mode="serialization"))


SCHEMAS: dict[str, SchemaSpec] = {
    "receipt": SchemaSpec(
        "dcpqual-receipt/v1", "an evidence bundle's receipt.json", "harness.schema.receipt:Receipt"
    ),
    "rank-record": SchemaSpec(
        "dcpqual-rank-record/v1",
        "a bundle's records/rank-NN.json",
        "harness.schema.rank_record:RankRecord",
    ),
    "rank-plan": SchemaSpec(
        "dcpqual-rank-plan/v1",
        "what every rank runs with ($DCPQUAL_PLAN)",
        "harness.schema.plan:RankPlan",
    ),
    "source-lock": SchemaSpec(
        "dcpqual-source-lock/v2", "an image's source.lock.json", "harness.schema.lock:SourceLock"
    ),
    "signature": SchemaSpec(
        "dcpqual-signature/v1",
        "one DCP transport signature",
        "harness.schema.signature:SignatureJson",
    ),
    "signatures": SchemaSpec(
        "dcpqual-signatures/v1",
        "what `dcpqual signatures --json` prints",
        "harness.schema.signature:SignatureList",
    ),
    "bench": SchemaSpec(
        "dcpqual-bench/v1",
        "what `dcpqual bench --out FILE` writes",
        "harness.schema.bench:BenchReport",
    ),
    "image-identity": SchemaSpec(
        "dcpqual-image-identity/v1",
        "an image build's identity.json",
        "harness.schema.image:ImageIdentity",
    ),
    "launch-record": SchemaSpec(
        "dcpqual-launch-record/v1",
        "a bundle's launch.json (how node 0's torchrun ended)",
        "harness.schema.launch:Launch",
    ),
    "node-marker": SchemaSpec(
        "dcpqual-node-marker/v1",
        "a multi-node run's nodes/node-KK.json",
        "harness.schema.launch:NodeState",
    ),
    "compare": SchemaSpec(
        "dcpqual-compare/v1",
        "what `dcpqual compare --json` prints (and a nightly's compare.json)",
        "harness.schema.compare:Comparison",
    ),
    "nightly": SchemaSpec(
        "dcpqual-nightly/v1",
        "a nightly report's nightly.json",
        "harness.schema.compare:NightlyResult",
    ),
    "mutants": SchemaSpec(
        "dcpqual-mutants/v1",
        "the mutation report (tests/mutants-report.json)",
        "harness.schema.mutants:MutantsReportFile",
    ),
    "smoke-result": SchemaSpec(
        "dcpqual-smoke-result/v1",
        "a GPU smoke bundle's smoke/result.json",
        "harness.schema.smoke:SmokeResult",
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
