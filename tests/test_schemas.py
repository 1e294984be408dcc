"""The committed JSON Schemas: equal to what the models generate, printed by `dcpqual schema`,
and what real files written by the harness validate against (an independent validator,
jsonschema, reads them), with unknown keys refused at every level."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from _support.identities import make_identity
from _support.smoke import passing_result

from harness.cli import main
from harness.core.signature import TransportSignature
from harness.errors import UsageError
from harness.evidence.run_context import RunContext
from harness.evidence.writer import finalize_bundle
from harness.launch import nodes
from harness.launch.plan import RunOptions, build_plan
from harness.qualify.compare import compare_receipts
from harness.schema import SCHEMAS, schema_text
from harness.schema.base import adapter_of
from harness.schema.capture import CaptureRecord, DetectorStatus, LazyEvent, SignatureUse
from harness.schema.compare import Comparison, NightlyResult
from harness.schema.image import Image
from harness.schema.launch import Launch
from harness.schema.plan import PLAN_ENV, RankPlan
from harness.schema.rank_record import RankFacts, RankRecord, TestOutcome, rank_record_path
from harness.schema.receipt import ChosenOptions, Receipt, RequestedCount, RunExtra

REPO = Path(__file__).resolve().parent.parent
SCHEMA_DIR = REPO / "schemas"
LOCK = REPO / "images/kimi-k3-cu133-torch213/source.lock.json"
NODE = "suites/capture/test_capture.py::test_kimi"
KIMI = TransportSignature("bf16", 96, 576, 512, 16)
REGENERATE = "for n in " + " ".join(SCHEMAS) + "; do dcpqual schema $n > schemas/$n.json; done"


def committed(name: str) -> dict[str, Any]:
    return json.loads((SCHEMA_DIR / f"{name}.json").read_text())


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = committed(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_committed_schema_is_what_the_models_generate(name: str) -> None:
    path = SCHEMA_DIR / f"{name}.json"
    assert path.is_file(), f"schemas/{name}.json is missing; regenerate: {REGENERATE}"
    assert path.read_text() == schema_text(name), f"schemas/{name}.json is stale: {REGENERATE}"


def test_schemas_folder_holds_only_the_known_formats() -> None:
    assert sorted(p.name for p in SCHEMA_DIR.iterdir()) == sorted(f"{n}.json" for n in SCHEMAS)


def test_each_schema_is_versioned_and_refuses_unknown_keys() -> None:
    for name, spec in SCHEMAS.items():
        schema = committed(name)
        assert schema["$id"] == spec.id and re.search(r"/v[1-9][0-9]*$", spec.id)
        objects = [schema, *schema.get("$defs", {}).values()]
        if schema.get("type") == "array":
            objects.remove(schema)
        for obj in objects:
            if obj.get("type") == "object" and "properties" in obj:
                assert obj.get("additionalProperties") is False, (name, obj.get("title"))


def test_dcpqual_schema_prints_the_committed_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "receipt"]) == 0
    assert capsys.readouterr().out == (SCHEMA_DIR / "receipt.json").read_text()


def test_dcpqual_schema_refuses_an_unknown_name_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["schema", "receipts"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "invalid choice" in err[0]


def test_the_schema_package_imports_no_torch() -> None:
    code = (
        "import sys, harness.schema, harness.schema.receipt, harness.schema.rank_record, "
        "harness.schema.lock, harness.schema.signature, harness.schema.cli\n"
        "from harness.schema import SCHEMAS, schema_text\n"
        "[schema_text(n) for n in SCHEMAS]\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def _record(rank: int, root: Path) -> RankRecord:
    capture = CaptureRecord(
        NODE,
        "kimi-k3",
        rank,
        "cpu-simulated",
        "vendored",
        signatures=(SignatureUse("kimi-k3", KIMI, warmed=True, used_in_capture=True),),
        detectors=(DetectorStatus("transport-registry", True),),
        replays=1,
    )
    control = CaptureRecord(
        f"{NODE}_control",
        "kimi-k3",
        rank,
        "cpu-simulated",
        "before-kimi",
        events=(LazyEvent("transport-registry", rank, "created transport", KIMI),),
        negative_control=True,
        expected_detectors=("transport-registry",),
    )
    return RankRecord(
        rank,
        2,
        complete=True,
        collected=(NODE,),
        tests=(TestOutcome(NODE, "passed", 0.5),),
        captures=(capture, control),
        extra=RankFacts(rootdir=str(root), node_index=0, transports=("torch:ag_rs",)),
    )


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("schemas") / "bundle"
    (out / "records").mkdir(parents=True)
    for rank in range(2):
        _record(rank, REPO).write(rank_record_path(out / "records", rank))
    extra = RunExtra(
        launch=Launch(exit_code=0, elapsed_s=1.5, leftovers=[7]),
        options=ChosenOptions(nproc_per_node=RequestedCount(requested="2", resolved=2)),
    )
    finalize_bundle(out, RunContext(world_size=2, nproc_per_node=2, tp=2, dcp=2, extra=extra))
    return out


def test_a_written_bundle_validates_against_the_committed_schemas(bundle: Path) -> None:
    receipt = json.loads((bundle / "receipt.json").read_text())
    validator("receipt").validate(receipt)
    assert receipt["run"]["extra"]["launch"]["leftovers"] == [7]
    assert [f"{i['key']}: {i['text']}" for i in receipt["limitation_items"]] == (
        receipt["limitations"]
    )
    for rank in range(2):
        validator("rank-record").validate(
            json.loads(rank_record_path(bundle / "records", rank).read_text())
        )
    launch = json.loads((bundle / "launch.json").read_text())
    validator("launch-record").validate(launch)
    assert launch == receipt["run"]["extra"]["launch"]
    with pytest.raises(jsonschema.ValidationError):
        validator("launch-record").validate({**launch, "surprise": 1})


def test_the_plan_the_launcher_hands_the_ranks_validates(tmp_path: Path) -> None:
    options = RunOptions(nproc_per_node=2, tp=2, warm_impl="before-kimi", models="both")
    raw = build_plan(options, tmp_path).env[PLAN_ENV]
    validator("rank-plan").validate(json.loads(raw))
    plan = RankPlan.from_environ({PLAN_ENV: raw})
    assert plan is not None and (plan.warm_impl, plan.models, plan.dcp) == (
        "before-kimi",
        "both",
        2,
    )


def test_a_malformed_plan_is_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match=r"DCPQUAL_PLAN is not a dcpqual-rank-plan/v1: tp"):
        RankPlan.from_environ({PLAN_ENV: json.dumps({"tp": 0})})
    with pytest.raises(UsageError, match="surprise"):
        RankPlan.from_environ({PLAN_ENV: json.dumps({"surprise": 1})})


def test_the_shipped_source_lock_validates() -> None:
    validator("source-lock").validate(json.loads(LOCK.read_text()))


def test_signatures_json_validates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["signatures", "--model", "kimi-k3", "--tp", "16", "--dcp", "16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    validator("signatures").validate(rows)
    validator("signature").validate(
        {k: v for k, v in rows[0].items() if k in committed("signature")["properties"]}
    )


def _put(data: dict[str, Any], path: tuple[str | int, ...], value: object) -> dict[str, Any]:
    edited = copy.deepcopy(data)
    target: Any = edited
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return edited


@pytest.mark.parametrize(
    "path",
    [
        ("surprise",),
        ("run", "extra", "surprise"),
        ("run", "extra", "launch", "surprise"),
        ("limitation_items", 0, "surprise"),
        ("capture", "surprise"),
    ],
)
def test_an_unknown_key_anywhere_in_a_receipt_is_refused(bundle: Path, path: tuple) -> None:
    receipt = json.loads((bundle / "receipt.json").read_text())
    edited = _put(receipt, path, 1)
    with pytest.raises(jsonschema.ValidationError):
        validator("receipt").validate(edited)
    with pytest.raises(ValueError, match="surprise"):
        Receipt.model_validate(edited)


@pytest.mark.parametrize(
    "path",
    [("surprise",), ("extra", "surprise"), ("tests", 0, "surprise"), ("captures", 0, "surprise")],
)
def test_an_unknown_key_anywhere_in_a_rank_record_is_refused(bundle: Path, path: tuple) -> None:
    record = json.loads(rank_record_path(bundle / "records", 0).read_text())
    edited = _put(record, path, 1)
    with pytest.raises(jsonschema.ValidationError):
        validator("rank-record").validate(edited)
    with pytest.raises(ValueError, match="surprise"):
        RankRecord.from_json(edited)


def test_a_node_marker_the_launcher_writes_validates(tmp_path: Path) -> None:
    started = nodes.started_marker(1, 2, "h:1", "2026-01-01T00:00:00+00:00")
    finished = nodes.finished_marker(started, Launch(exit_code=3, timed_out=True, leftovers=[9]))
    assert finished.leftovers == [9]  # how node 0's receipt learns of this node's leftovers
    for marker in (started, finished):
        nodes.write_marker(tmp_path, marker)
        data = json.loads(nodes.marker_path(tmp_path, 1).read_text())
        validator("node-marker").validate(data)
        with pytest.raises(jsonschema.ValidationError):
            validator("node-marker").validate({**data, "surprise": 1})


def test_an_image_identity_validates_and_is_the_receipts_image() -> None:
    identity = make_identity(LOCK)
    data = json.loads(json.dumps(identity.to_json()))
    validator("image-identity").validate(data)
    for edited in ({**data, "surprise": 1}, {k: v for k, v in data.items() if k != "digest"}):
        with pytest.raises(jsonschema.ValidationError):
            validator("image-identity").validate(edited)
    receipt_image = committed("receipt")["$defs"]["Image"]
    assert set(data) == set(receipt_image["properties"])
    assert isinstance(identity, Image) and Image.model_validate(data) == Image(**dict(identity))


def test_a_smoke_result_validates(tmp_path: Path) -> None:
    data = json.loads(json.dumps(passing_result().to_json()))
    validator("smoke-result").validate(data)
    for path in [("surprise",), ("machine", "surprise"), ("controls", 0, "events", 0, "surprise")]:
        with pytest.raises(jsonschema.ValidationError):
            validator("smoke-result").validate(_put(data, path, 1))


def test_a_value_class_builds_its_adapter_once_and_refuses_unknown_keys() -> None:
    assert adapter_of(CaptureRecord) is adapter_of(CaptureRecord)
    assert adapter_of(CaptureRecord) is not adapter_of(LazyEvent)
    event = LazyEvent("transport-registry", 0, "created transport", KIMI)
    assert LazyEvent.from_json(event.to_json()) == event
    with pytest.raises(ValueError, match="surprise"):
        LazyEvent.from_json({**event.to_json(), "surprise": 1})


def _comparison(bundle: Path) -> Comparison:
    base = json.loads((bundle / "receipt.json").read_text())
    head = _put(_put(base, ("warm_impl",), "before-kimi"), ("environment", "torch"), "2.14.0")
    return compare_receipts(base, head, base_ref=(str(bundle), "a" * 64, "b" * 64))


def test_a_comparison_and_a_nightly_result_validate_and_read_back(bundle: Path) -> None:
    comparison = _comparison(bundle)
    assert comparison.identity and comparison.signatures and comparison.suites
    night = NightlyResult(bundle.parent, bundle, None, (0,), (), "pass", comparison)
    for name, value in (("compare", comparison), ("nightly", night)):
        data = json.loads(json.dumps(value.to_json()))
        validator(name).validate(data)
        assert type(value).from_json(data) == value
    data = json.loads(json.dumps(night.to_json()))
    for path in [
        ("surprise",),
        ("comparison", "surprise"),
        ("comparison", "base", "surprise"),
        ("comparison", "signatures", 0, "surprise"),
        ("comparison", "suites", 0, "base", "surprise"),
        ("comparison", "identity", 0, "surprise"),
    ]:
        with pytest.raises(jsonschema.ValidationError):
            validator("nightly").validate(_put(data, path, 1))
        with pytest.raises(ValueError, match="surprise"):
            NightlyResult.from_json(_put(data, path, 1))


@pytest.mark.parametrize(
    "path, value, said",
    [
        (("exit_code",), 1, "nightly result: exit_code=1 but the values give 0"),
        (("comparison", "regressed"), True, "comparison: regressed=True but the values give False"),
        (("comparison", "signatures", 0, "change"), "new", "change='new' but the values give"),
    ],
)
def test_a_nightly_result_whose_derived_values_were_edited_is_refused(
    bundle: Path, path: tuple[str | int, ...], value: object, said: str
) -> None:
    night = NightlyResult(bundle.parent, bundle, None, (0,), (), "pass", _comparison(bundle))
    data = json.loads(json.dumps(night.to_json()))
    with pytest.raises(ValueError, match=re.escape(said)):
        NightlyResult.from_json(_put(data, path, value))
