"""Forked ranks share one string-hash seed, and the receipt must say so: each rank records how it
started (forked or not, its hash of a fixed probe string, a fixed PYTHONHASHSEED), so verify
holds the zygote's claim and the `hash-seed` limitation to the records. A forger who drops the
limitation, calls the seeds per-rank, or leaves the zygote out is caught; a cold start, whose
ranks each drew their own seed, needs no such limitation; records that predate the fact
require nothing new."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _support.forge import forge
from _support.runs import receipt, records, run

from harness.evidence.files import sha256_file
from harness.evidence.rules import hash_seed_limitation
from harness.evidence.verify import verify_bundle
from harness.schema.launch import NodeState, ZygoteState

pytestmark = [pytest.mark.torchrun, pytest.mark.xdist_group("torchrun")]

Edit = Callable[[dict[str, Any]], None]


def _drop_limitation(data: dict[str, Any]) -> None:
    data["limitations"] = [x for x in data["limitations"] if not x.startswith("hash-seed: ")]


def _per_rank(data: dict[str, Any]) -> None:
    _drop_limitation(data)
    data["run"]["extra"]["launch"]["zygote"]["hash_seed"] = "per-rank-random"


def _no_zygote(data: dict[str, Any]) -> None:
    _drop_limitation(data)
    data["run"]["extra"]["launch"]["zygote"] = None


def _not_used(data: dict[str, Any]) -> None:
    _drop_limitation(data)
    data["run"]["extra"]["launch"]["zygote"].update(
        used=False, forked=0, not_used="no rank asked it for a fork", hash_seed="per-rank-random"
    )


@pytest.fixture(scope="module")
def forked_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if "PYTHONHASHSEED" in os.environ:
        pytest.skip("a fixed PYTHONHASHSEED gives every rank the same seed under either launch")
    out = tmp_path_factory.mktemp("hash-seed") / "forked"
    code, _ = run(out, 2, "rank_pass.py")
    assert code == 0
    return out


def _copy(bundle: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy, symlinks=True)
    return copy


def test_forked_ranks_record_it_and_their_bundle_verifies(forked_bundle: Path) -> None:
    recs = records(forked_bundle)
    starts = [r.start for r in recs.values()]
    assert all(s is not None and s.forked and not s.hash_seed_fixed for s in starts), starts
    assert len({s.hash_probe for s in starts if s is not None}) == 1, starts
    assert any(line.startswith("hash-seed: ") for line in receipt(forked_bundle)["limitations"])
    result = verify_bundle(forked_bundle)
    assert result.ok, result.problems


@pytest.mark.parametrize(
    "edit, named",
    [
        (_drop_limitation, "limitations do not name 'hash-seed'"),
        (_per_rank, "run.extra.launch.zygote.hash_seed is 'per-rank-random'"),
        (_no_zygote, "run.extra.launch.zygote is None"),
        (_not_used, "run.extra.launch.zygote.hash_seed is 'per-rank-random'"),
    ],
    ids=["dropped", "per-rank", "no-zygote", "not-used"],
)
def test_a_receipt_that_hides_the_shared_seed_does_not_verify(
    forked_bundle: Path, tmp_path: Path, edit: Edit, named: str
) -> None:
    _refused_naming(_copy(forked_bundle, tmp_path), edit, named)


def test_records_that_predate_the_start_fact_verify_as_before(
    forked_bundle: Path, tmp_path: Path
) -> None:
    """Without the records' word the zygote's own claim still requires the limitation."""
    bundle = _copy(forked_bundle, tmp_path)
    for path in (bundle / "records").glob("rank-*.json"):
        data = json.loads(path.read_text())
        del data["start"]
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    def rehash(data: dict[str, Any]) -> None:
        for path in (bundle / "records").glob("rank-*.json"):
            data["files"][f"records/{path.name}"] = sha256_file(path)

    forge(bundle, rehash)
    result = verify_bundle(bundle)
    assert result.ok, result.problems
    forge(bundle, _per_rank)  # nothing to hold the claim to: accepted as older bundles were
    assert verify_bundle(bundle).ok
    forge(
        bundle,
        lambda data: data["run"]["extra"]["launch"]["zygote"].update(hash_seed="shared-random"),
    )
    assert "limitations do not name 'hash-seed'" in " ".join(verify_bundle(bundle).problems)


def test_a_cold_start_does_not_require_the_limitation(tmp_path, monkeypatch) -> None:
    """OMP_NUM_THREADS=2 makes the zygote refuse: each rank drew its own seed."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    out = tmp_path / "cold"
    code, _ = run(out, 2, "rank_pass.py")
    assert code == 0
    starts = [r.start for r in records(out).values()]
    assert all(s is not None and not s.forked for s in starts), starts
    if "PYTHONHASHSEED" not in os.environ:
        assert len({s.hash_probe for s in starts if s is not None}) == 2, starts
    assert not any(line.startswith("hash-seed: ") for line in receipt(out)["limitations"])
    result = verify_bundle(out)
    assert result.ok, result.problems


def _refused_naming(bundle: Path, edit: Edit, named: str) -> None:
    """The bundle forged by `edit` does not verify, and a problem says `named`."""
    forge(bundle, edit)
    result = verify_bundle(bundle)
    assert not result.ok
    assert any(named in p for p in result.problems), result.problems


def _two_nodes(bundle: Path, node1_zygote: dict[str, Any] | None) -> None:
    """The bundle as if its rank 1 ran on a second node, whose marker carries `node1_zygote`."""
    path = bundle / "records" / "rank-01.json"
    data = json.loads(path.read_text())
    data.update(node_rank=1, local_rank=0)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    def edit(receipt: dict[str, Any]) -> None:
        receipt["files"]["records/rank-01.json"] = sha256_file(path)
        receipt["geometry"].update(nnodes=2, nproc_per_node=1)
        zygote = receipt["run"]["extra"]["launch"]["zygote"]
        zygote.update(forked=1)
        marker = {"nnodes": 2, "rdzv_endpoint": "node0:29500", "state": "finished"}
        receipt["run"]["extra"]["nodes"] = {
            "0": {**marker, "node_rank": 0, "zygote": zygote},
            "1": {**marker, "node_rank": 1, "zygote": node1_zygote},
        }
        nodes = {
            k: NodeState.model_validate(v) for k, v in receipt["run"]["extra"]["nodes"].items()
        }
        text = hash_seed_limitation(ZygoteState.model_validate(zygote), nodes).get("hash-seed")
        lines = receipt["limitations"]
        receipt["limitations"] = [
            f"hash-seed: {text}" if x.startswith("hash-seed: ") else x for x in lines
        ]

    forge(bundle, edit)


def test_another_nodes_forked_ranks_need_that_nodes_zygote_in_the_receipt(
    forked_bundle: Path, tmp_path: Path
) -> None:
    """Node 0's launch speaks for node 0: a second node's forked ranks are held to the zygote
    its marker names, and the limitation counts the ranks of every node's zygote."""
    said = "node 1's zygote: used, shared-random seed is False"
    bundle = _copy(forked_bundle, tmp_path)
    _two_nodes(bundle, None)
    assert said in " ".join(verify_bundle(bundle).problems)
    node1 = receipt(bundle)["run"]["extra"]["launch"]["zygote"]
    again = tmp_path / "again"
    shutil.copytree(forked_bundle, again, symlinks=True)
    _two_nodes(again, node1)
    problems = " ".join(verify_bundle(again).problems)
    assert "node 1's zygote" not in problems and "'hash-seed'" not in problems, problems


def _zygote(**changes: Any) -> Edit:
    return lambda data: data["run"]["extra"]["launch"]["zygote"].update(changes)


def _reworded(key: str) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        lines = data["limitations"]
        assert any(x.startswith(f"{key}: ") for x in lines), lines
        data["limitations"] = [f"{key}: none" if x.startswith(f"{key}: ") else x for x in lines]

    return edit


@pytest.mark.parametrize(
    "edit, named",
    [
        (_zygote(forked=0), "run.extra.launch.zygote.used is True but"),
        (_zygote(forked=1), "run.extra.launch.zygote.forked (records: forked) is 1"),
        (_zygote(used=False), "run.extra.launch.zygote.used is False but"),
        (
            _zygote(sent_cold=2, sent_cold_why="planted reason"),
            "forked + sent_cold <= its 2 rank(s) is False",
        ),
        (_reworded("hash-seed"), "limitation 'hash-seed' does not say what"),
        (_reworded("nccl"), "limitation 'nccl' does not say what"),
    ],
    ids=["none-forked", "fewer-forked", "not-used", "cold-too", "seed-text", "other-text"],
)
def test_zygote_counts_and_limitation_texts_are_held_to_the_bundle(
    forked_bundle: Path, tmp_path: Path, edit: Edit, named: str
) -> None:
    """The zygote's counts agree with each other, with the world and with the records; each
    required limitation says what the rules give for the receipt's facts, not only its key."""
    _refused_naming(_copy(forked_bundle, tmp_path), edit, named)


def test_another_nodes_zygote_counts_are_held_to_that_nodes_ranks(
    forked_bundle: Path, tmp_path: Path
) -> None:
    node1 = receipt(forked_bundle)["run"]["extra"]["launch"]["zygote"]
    bundle = _copy(forked_bundle, tmp_path)
    _two_nodes(bundle, {**node1, "forked": 2})  # node 1 has one rank
    problems = " ".join(verify_bundle(bundle).problems)
    assert "node 1's zygote: forked + sent_cold <= its 1 rank(s) is False" in problems, problems
    assert "node 1's zygote.forked (records: forked) is 2" in problems, problems
