"""One string-hash seed per node, fixed by the launcher, stated by the receipt and held to the
records. Ranks forked from one forkserver can only share its seed, so the launcher gives every
rank of its node one (cold ones too, tests/test_run_torchrun.py: a forked and a cold rank hash
alike), each rank records the seed
it started with and its hash of a fixed probe string, and the receipt states the seeds
(`hash_seeds`) with the `hash-seed` limitation where the launcher drew the seed. A forger who
drops or changes the seeds, calls a drawn seed given, or drops the limitation is caught, and
so are records whose ranks of one seed hashed the probe differently.

Bundles written before the launcher fixed a seed state the seeds through each node's zygote
(`shared-random`, `per-rank-random`, `fixed`), held to the records' probes: those checks still
hold for such bundles (`legacy`, which rewrites a new bundle as that writer wrote it)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import forge as forger
from _support.hash_probe import probe_under
from _support.runs import receipt, records, run

from harness.evidence.files import sha256_file
from harness.evidence.hashprobe import probe_hash
from harness.evidence.rules import hash_seed_limitation
from harness.evidence.verify import verify_bundle
from harness.schema.launch import NodeState, ZygoteState

pytestmark = [pytest.mark.torchrun]

Edit = Callable[[dict[str, Any]], None]


def forge(bundle: Path, edit: Edit) -> None:
    """These forgers write the launch record again with the receipt (`_support.forge`), so only
    the seed and zygote checks can tell."""
    forger.forge(bundle, edit, launch_record=True)


@pytest.fixture(scope="module")
def unset_hash_seed() -> Iterator[None]:
    """The launcher draws the seed only where none is given."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTHONHASHSEED", raising=False)
        yield


@pytest.fixture(scope="module")
def forked_bundle(tmp_path_factory: pytest.TempPathFactory, unset_hash_seed: None) -> Path:
    out = tmp_path_factory.mktemp("hash-seed") / "forked"
    code, _ = run(out, 2, "rank_pass.py")
    assert code == 0
    return out


def _copy(bundle: Path, tmp_path: Path, name: str = "bundle") -> Path:
    copy = tmp_path / name
    shutil.copytree(bundle, copy, symlinks=True)
    return copy


def _only_seed(bundle: Path) -> int:
    (seed,) = {r.start.hash_seed for r in records(bundle).values() if r.start is not None}
    assert seed is not None
    return seed


def test_every_rank_starts_with_the_launchers_seed_and_the_receipt_states_it(
    forked_bundle: Path,
) -> None:
    recs = records(forked_bundle)
    starts = [r.start for r in recs.values() if r.start is not None]
    assert len(starts) == 2 and all(s.forked and s.hash_seed_drawn for s in starts), starts
    seed = _only_seed(forked_bundle)
    assert {s.hash_probe for s in starts} == {probe_under(seed)}, "the ranks hashed otherwise"
    r = receipt(forked_bundle)
    assert r["hash_seeds"] == [{"node": 0, "seed": seed, "drawn": True, "ranks": [0, 1]}]
    (line,) = [x for x in r["limitations"] if x.startswith("hash-seed: ")]
    assert f"one string-hash seed ({seed}), drawn by the launcher" in line
    result = verify_bundle(forked_bundle)
    assert result.ok, result.problems


def test_a_seed_the_user_gives_is_every_ranks_and_needs_no_limitation(tmp_path: Path) -> None:
    out = tmp_path / "given"
    code, _ = run(out, 2, "rank_pass.py", "--hash-seed", "4242")
    assert code == 0
    starts = [r.start for r in records(out).values() if r.start is not None]
    assert [(s.hash_seed, s.hash_seed_drawn) for s in starts] == [(4242, False)] * 2
    assert {s.hash_probe for s in starts} == {probe_under(4242)}
    r = receipt(out)
    assert r["hash_seeds"] == [{"node": 0, "seed": 4242, "drawn": False, "ranks": [0, 1]}]
    assert not any(line.startswith("hash-seed: ") for line in r["limitations"])
    result = verify_bundle(out)
    assert result.ok, result.problems


def _seeds(**changes: Any) -> Edit:
    return lambda data: data["hash_seeds"][0].update(changes)


def _no_seeds(data: dict[str, Any]) -> None:
    data["hash_seeds"] = None


def _given(data: dict[str, Any]) -> None:
    data["hash_seeds"][0]["drawn"] = False
    _drop_limitation(data)


@pytest.mark.parametrize(
    "edit, named",
    [
        (_no_seeds, "hash_seeds is None but"),
        (_seeds(seed=7), "hash_seeds[0].seed is 7 but"),
        (_given, "hash_seeds[0].drawn is False but"),
        (lambda data: _drop_limitation(data), "limitations do not name 'hash-seed'"),
    ],
    ids=["dropped-seeds", "other-seed", "called-given", "dropped-limitation"],
)
def test_a_receipt_that_misstates_the_seed_does_not_verify(
    forked_bundle: Path, tmp_path: Path, edit: Edit, named: str
) -> None:
    _refused_naming(_copy(forked_bundle, tmp_path), edit, named)


def _edit_records(bundle: Path, change: Callable[[int, dict[str, Any]], None]) -> None:
    """Rank records edited by `change(rank, start)` and the bundle resealed around them."""
    for path in sorted((bundle / "records").glob("rank-*.json")):
        data = json.loads(path.read_text())
        change(data["rank"], data["start"])
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    def rehash(data: dict[str, Any]) -> None:
        for path in (bundle / "records").glob("rank-*.json"):
            data["files"][f"records/{path.name}"] = sha256_file(path)

    forge(bundle, rehash)


def test_ranks_of_one_seed_that_hashed_differently_do_not_verify(
    forked_bundle: Path, tmp_path: Path
) -> None:
    """A rank whose environment said the seed but whose interpreter had another (a fork of an
    interpreter started without it) hashes the probe otherwise."""
    bundle = _copy(forked_bundle, tmp_path)
    _edit_records(bundle, lambda rank, start: start.update(hash_probe=12345) if rank else None)
    problems = verify_bundle(bundle).problems
    assert any("ranks with seed" in p and "hashed the probe to" in p for p in problems), problems


def test_ranks_that_all_hashed_otherwise_than_their_seed_does_not_verify(
    forked_bundle: Path, tmp_path: Path
) -> None:
    """Ranks all forked from a zygote started with another seed than their environment says
    hash the probe alike, but not as the seed they record does."""
    bundle = _copy(forked_bundle, tmp_path)
    other = probe_under(_only_seed(bundle) + 1)
    _edit_records(bundle, lambda rank, start: start.update(hash_probe=other))
    problems = verify_bundle(bundle).problems
    said = f"hashed the probe to is {other!r} but"
    assert any("ranks with seed" in p and said in p for p in problems), problems


def test_the_probe_each_seed_gives_is_pythons(tmp_path: Path) -> None:
    """What verify computes a seed to hash the probe to is what an interpreter started with it
    hashes it to (0: randomization off; the largest seed)."""
    for seed in (0, 1, 4242, 2294986917, 4294967295):
        assert probe_hash(seed) == probe_under(seed), seed


def test_a_node_whose_ranks_started_with_two_seeds_does_not_verify(
    forked_bundle: Path, tmp_path: Path
) -> None:
    bundle = _copy(forked_bundle, tmp_path)
    _edit_records(bundle, lambda rank, start: start.update(hash_seed=start["hash_seed"] + rank))
    forge(bundle, _restated_seeds(bundle))
    problems = verify_bundle(bundle).problems
    assert any("node 0's ranks started with" in p for p in problems), problems


def _unseeded(rank: int, start: dict[str, Any]) -> None:
    """Rank 1 as if it started without the launcher's seed (its PYTHONHASHSEED unset)."""
    if rank == 1:
        start.update(hash_seed_fixed=False, hash_probe=12345)
        start.pop("hash_seed")
        start.pop("hash_seed_drawn")


def _startless(bundle: Path) -> None:
    """Rank 1's record without its start, as records written before the start fact."""
    path = bundle / "records" / "rank-01.json"
    data = json.loads(path.read_text())
    del data["start"]
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    digest = sha256_file(path)
    forge(bundle, lambda receipt: receipt["files"].update({"records/rank-01.json": digest}))


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda b: _edit_records(b, _unseeded), "hash_seeds: rank 1's start.hash_seed is None"),
        (_startless, "hash_seeds: rank 1's start is None"),
    ],
    ids=["unseeded", "startless"],
)
def test_a_rank_whose_record_states_no_seed_beside_ranks_that_do_does_not_verify(
    forked_bundle: Path, tmp_path: Path, change: Callable[[Path], None], named: str
) -> None:
    """The launcher gives every rank a seed: a record without one beside records with one is a
    rank that started otherwise (or a forger's), and would leave the other ranks' shared
    drawn seed looking like one rank's."""
    bundle = _copy(forked_bundle, tmp_path)
    change(bundle)
    forge(bundle, _restated_seeds(bundle))
    forge(bundle, _drop_limitation)
    problems = verify_bundle(bundle).problems
    assert any(named in p for p in problems), problems


def test_a_seed_the_records_do_not_call_given_is_drawn(forked_bundle: Path, tmp_path: Path) -> None:
    """A rank that could not tell whether its seed was given (no rank plan) is not taken for
    one the user gave: the shared seed still needs the limitation."""
    bundle = _copy(forked_bundle, tmp_path)
    _edit_records(bundle, lambda rank, start: start.update(hash_seed_drawn=None))
    forge(bundle, _restated_seeds(bundle))
    assert receipt(bundle)["hash_seeds"][0]["drawn"] is True
    _refused_naming(bundle, _drop_limitation, "limitations do not name 'hash-seed'")


def _restated_seeds(bundle: Path) -> Edit:
    """A careful forger's receipt edit: `hash_seeds` as the (edited) records give them."""
    from harness.evidence.collect import hash_seeds_of

    def edit(data: dict[str, Any]) -> None:
        seeds = hash_seeds_of(records(bundle))
        data["hash_seeds"] = None if seeds is None else [s.model_dump() for s in seeds]
        forger.restate_limitations(data, "hash-seed")

    return edit


# -- bundles written before the launcher fixed the seed ----------------------------------------


def legacy(bundle: Path) -> None:
    """`bundle` as the writer before `hash_seeds` wrote it: records without the seed (their
    PYTHONHASHSEED unset), no `hash_seeds`, each zygote's `hash_seed` mode, and the `hash-seed`
    limitation those give."""

    def unfixed(rank: int, start: dict[str, Any]) -> None:
        start.update(hash_seed_fixed=False)
        start.pop("hash_seed")
        start.pop("hash_seed_drawn")

    _edit_records(bundle, unfixed)

    def edit(data: dict[str, Any]) -> None:
        data.pop("hash_seeds")
        # The launcher's earlier fork server, which forked both ranks, as it said so.
        zygote = ZygoteState(pid=1, ready=True, used=True, forked=2).model_dump(mode="json")
        data["run"]["extra"]["launch"]["zygote"] = zygote
        text = hash_seed_limitation(ZygoteState.model_validate(zygote))["hash-seed"]
        lines = [x for x in data["limitations"] if not x.startswith("hash-seed: ")]
        data["limitations"] = [f"hash-seed: {text}", *lines]

    forge(bundle, edit)


@pytest.fixture(scope="module")
def legacy_bundle(forked_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    bundle = _copy(forked_bundle, tmp_path_factory.mktemp("hash-seed"), "legacy")
    legacy(bundle)
    return bundle


def test_a_legacy_bundle_verifies(legacy_bundle: Path) -> None:
    assert receipt(legacy_bundle).get("hash_seeds") is None
    result = verify_bundle(legacy_bundle)
    assert result.ok, result.problems


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
    legacy_bundle: Path, tmp_path: Path, edit: Edit, named: str
) -> None:
    _refused_naming(_copy(legacy_bundle, tmp_path), edit, named)


def test_records_that_predate_the_start_fact_verify_as_before(
    legacy_bundle: Path, tmp_path: Path
) -> None:
    """Without the records' word the zygote's own claim still requires the limitation."""
    bundle = _copy(legacy_bundle, tmp_path)
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
        marker = {"nnodes": 2, "rdzv_endpoint": "node0:29500", "state": "finished", "exit_code": 0}
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
    legacy_bundle: Path, tmp_path: Path
) -> None:
    """Node 0's launch speaks for node 0: a second node's forked ranks are held to the zygote
    its marker names, and the limitation counts the ranks of every node's zygote."""
    said = "node 1's zygote is None but the rank records and JUnit reports say 'ranks forked"
    bundle = _copy(legacy_bundle, tmp_path)
    _two_nodes(bundle, None)
    assert said in " ".join(verify_bundle(bundle).problems)
    node1 = receipt(bundle)["run"]["extra"]["launch"]["zygote"]
    again = tmp_path / "again"
    shutil.copytree(legacy_bundle, again, symlinks=True)
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
    legacy_bundle: Path, tmp_path: Path, edit: Edit, named: str
) -> None:
    """The zygote's counts agree with each other, with the world and with the records; each
    required limitation says what the rules give for the receipt's facts, not only its key."""
    _refused_naming(_copy(legacy_bundle, tmp_path), edit, named)


def test_another_nodes_zygote_counts_are_held_to_that_nodes_ranks(
    legacy_bundle: Path, tmp_path: Path
) -> None:
    node1 = receipt(legacy_bundle)["run"]["extra"]["launch"]["zygote"]
    bundle = _copy(legacy_bundle, tmp_path)
    _two_nodes(bundle, {**node1, "forked": 2})  # node 1 has one rank
    problems = " ".join(verify_bundle(bundle).problems)
    assert "node 1's zygote: forked + sent_cold <= its 1 rank(s) is False" in problems, problems
    assert "node 1's zygote.forked (records: forked) is 2" in problems, problems


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory, unset_hash_seed: None) -> Path:
    """Four forked ranks in the legacy layout, to be relabelled as two nodes of two: a node's
    probes can agree."""
    out = tmp_path_factory.mktemp("hash-seed") / "four"
    code, _ = run(out, 4, "rank_pass.py")
    assert code == 0
    legacy(out)
    return out


_UNUSED = {"used": False, "forked": 0, "not_used": "planted refusal"}
_COLD = {"forked": False}
_OTHER_PROBE = {"forked": False, "hash_probe": 12345}
Zygote = dict[str, Any] | None  # changes to the launch's zygote, or None: no zygote


def _two_nodes_of_two(
    bundle: Path, starts: dict[int, dict[str, Any]], node0: Zygote, node1: Zygote
) -> None:
    """The four-rank bundle as if ranks 2 and 3 ran on a second node: each rank's `start`
    changed by `starts`, each node's zygote its launch's (two forked) changed by `node0` and
    `node1`, the `hash-seed` limitation restated for those zygotes, and everything resealed."""
    for rank in range(4):
        path = bundle / "records" / f"rank-{rank:02d}.json"
        data = json.loads(path.read_text())
        data.update(node_rank=rank // 2, local_rank=rank % 2)
        data["start"].update(starts.get(rank, {}))
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    def edit(receipt: dict[str, Any]) -> None:
        for path in (bundle / "records").glob("rank-*.json"):
            receipt["files"][f"records/{path.name}"] = sha256_file(path)
        receipt["geometry"].update(nnodes=2, nproc_per_node=2)
        launched = {**receipt["run"]["extra"]["launch"]["zygote"], "forked": 2}
        zygotes = [None if z is None else {**launched, **z} for z in (node0, node1)]
        receipt["run"]["extra"]["launch"]["zygote"] = zygotes[0]
        marker = {"nnodes": 2, "rdzv_endpoint": "node0:29500", "state": "finished", "exit_code": 0}
        nodes = {str(n): {**marker, "node_rank": n, "zygote": z} for n, z in enumerate(zygotes)}
        receipt["run"]["extra"]["nodes"] = nodes
        text = hash_seed_limitation(
            None if zygotes[0] is None else ZygoteState.model_validate(zygotes[0]),
            {k: NodeState.model_validate(v) for k, v in nodes.items()},
        ).get("hash-seed")
        lines = [x for x in receipt["limitations"] if not x.startswith("hash-seed: ")]
        receipt["limitations"] = lines if text is None else [f"hash-seed: {text}", *lines]

    forge(bundle, edit)


_SAY = "but the rank records and JUnit reports say"


@pytest.mark.parametrize(
    "starts, node0, node1, named",
    [
        (
            {2: _COLD, 3: _COLD},
            {},
            None,
            f"node 1's zygote is None {_SAY} 'ranks forked from a zygote'",
        ),
        (
            {2: _COLD, 3: _COLD},
            {},
            {**_UNUSED, "hash_seed": "per-rank-random"},
            f"node 1's zygote.hash_seed is 'per-rank-random' {_SAY} 'shared-random'",
        ),
        (
            {2: _COLD, 3: _COLD},
            {},
            {**_UNUSED, "hash_seed": "fixed"},
            f"node 1's zygote.hash_seed is 'fixed' {_SAY} 'shared-random'",
        ),
        (
            {0: _COLD, 1: _COLD},
            {**_UNUSED, "hash_seed": "per-rank-random"},
            {},
            f"node 0's zygote.hash_seed is 'per-rank-random' {_SAY} 'shared-random'",
        ),
        (
            {2: _COLD, 3: _OTHER_PROBE},
            {},
            {**_UNUSED, "hash_seed": "shared-random"},
            f"node 1's zygote.hash_seed is 'shared-random' {_SAY} 'per-rank-random'",
        ),
        (
            {2: {"hash_seed_fixed": True}, 3: {"hash_seed_fixed": True}},
            {},
            {},
            f"node 1's zygote.hash_seed is 'shared-random' {_SAY} 'fixed'",
        ),
    ],
    ids=["probes-vs-none", "probes-vs-per-rank", "probes-vs-fixed", "node-0", "distinct", "fixed"],
)
def test_a_nodes_hash_seed_claim_is_held_to_that_nodes_probes(
    four_ranks: Path,
    tmp_path: Path,
    starts: dict[int, dict[str, Any]],
    node0: Zygote,
    node1: Zygote,
    named: str,
) -> None:
    """A node's ranks that hashed the probe alike share one seed whatever their `forked` flags
    say, and ranks that hashed it differently do not: the claim of that node's zygote (node
    0's launch, the other's marker) must say what its own ranks' records show."""
    bundle = _copy(four_ranks, tmp_path)
    _two_nodes_of_two(bundle, starts, node0, node1)
    problems = verify_bundle(bundle).problems
    assert any(named in p for p in problems), problems


@pytest.mark.parametrize(
    "starts, node1",
    [({}, {}), ({2: _COLD, 3: _OTHER_PROBE}, None)],
    ids=["both-forked", "node-1-cold"],
)
def test_each_nodes_probes_are_compared_within_that_node(
    four_ranks: Path, tmp_path: Path, starts: dict[int, dict[str, Any]], node1: Zygote
) -> None:
    """Seeds are per zygote, so per node: a cold node 1 whose rank 2 hashed the probe as node
    0's forked ranks did still drew its own seeds, and needs no zygote of its own."""
    bundle = _copy(four_ranks, tmp_path)
    _two_nodes_of_two(bundle, starts, {}, node1)
    result = verify_bundle(bundle)
    assert result.ok, result.problems
