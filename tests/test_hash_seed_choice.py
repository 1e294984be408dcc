"""Which string-hash seed a run's ranks start with: `--hash-seed` > `$PYTHONHASHSEED` > a rerun's
bundle > drawn by the launcher, one per node, in every rank's PYTHONHASHSEED. A bad value is one
line naming where it came from. (That the ranks start with it, and what the evidence says of it:
tests/test_verify_hash_seed.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _support.evidence_factory import failing_run

from harness.cli import main
from harness.evidence import verify
from harness.evidence.writer import finalize_bundle
from harness.launch import launcher
from harness.launch.options import HASH_SEED_MAX
from harness.launch.plan import RunOptions, build_plan
from harness.schema.plan import RankPlan

SUITE = "tests/rank_suites/rank_pass.py"


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[RunOptions]:
    seen: list[RunOptions] = []
    monkeypatch.setattr(launcher, "run", lambda options, **kw: seen.append(options) or 0)
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    return seen


def seed_of(launched: list[RunOptions], *argv: str) -> int | None:
    assert main(["run", "--nproc-per-node", "2", *argv, "--", SUITE]) == 0
    return launched.pop().hash_seed


def test_the_flag_beats_the_environment_and_random_asks_for_a_drawn_seed(
    launched: list[RunOptions], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert seed_of(launched) is None
    assert seed_of(launched, "--hash-seed", "0") == 0
    monkeypatch.setenv("PYTHONHASHSEED", "9")
    assert seed_of(launched) == 9
    assert seed_of(launched, "--hash-seed", "7") == 7
    assert seed_of(launched, "--hash-seed", "random") is None
    monkeypatch.setenv("PYTHONHASHSEED", "random")
    assert seed_of(launched) is None


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--hash-seed", "x"], None, "--hash-seed"),
        (["--hash-seed", "-1"], None, "--hash-seed"),
        (["--hash-seed", str(HASH_SEED_MAX + 1)], None, "--hash-seed"),
        (["--hash-seed", "\u00b2"], None, "--hash-seed"),
        (["--hash-seed", "\u0663"], None, "--hash-seed"),
        ([], "12a", "$PYTHONHASHSEED"),
    ],
    ids=["word", "negative", "too-large", "superscript", "arabic-indic", "environment"],
)
def test_a_bad_seed_is_one_line_naming_where_it_came_from(
    launched: list[RunOptions],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: str | None,
    named: str,
) -> None:
    if env is not None:
        monkeypatch.setenv("PYTHONHASHSEED", env)
    assert main(["run", "--nproc-per-node", "2", *argv, "--", SUITE]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert named in line and "0..4294967295" in line and launched == []


def test_every_rank_of_the_node_gets_the_seed_asked_for_or_one_drawn(tmp_path: Path) -> None:
    given = build_plan(RunOptions(nproc_per_node=2, hash_seed=77), tmp_path / "given")
    assert given.env["PYTHONHASHSEED"] == "77"
    plan = RankPlan.from_environ(given.env)
    assert plan is not None and plan.hash_seed == 77  # the ranks record it as given
    drawn = [
        build_plan(RunOptions(nproc_per_node=2), tmp_path / f"drawn-{i}").env["PYTHONHASHSEED"]
        for i in range(3)
    ]
    assert all(1 <= int(seed) <= HASH_SEED_MAX for seed in drawn)
    assert len(set(drawn)) > 1, "three draws gave one seed"
    plan = RankPlan.from_environ(build_plan(RunOptions(nproc_per_node=2), tmp_path / "d").env)
    assert plan is not None and plan.hash_seed is None  # the ranks record it as drawn


def test_a_rerun_starts_its_ranks_with_the_bundles_seed_unless_told_otherwise(
    tmp_path: Path, launched: list[RunOptions], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "failed"
    finalize_bundle(out, failing_run(out, world=2, bad_rank=1))
    data = json.loads((out / "receipt.json").read_text())
    data["hash_seeds"] = [{"node": 0, "seed": 31337, "drawn": True, "ranks": [0, 1]}]
    data["run"]["rootdir"] = "/srv/checkout"
    (out / "receipt.json").write_text(json.dumps(data))
    monkeypatch.setattr(verify, "verify_bundle", lambda path: verify.VerifyResult(path, ()))
    rerun = ["run", "--rerun-failed", str(out)]
    assert main(rerun) == 0
    options = launched.pop()
    assert (options.hash_seed, options.hash_seed_drawn) == (31337, True)
    assert main([*rerun, "--hash-seed", "5"]) == 0
    assert launched.pop().hash_seed == 5
    monkeypatch.setenv("PYTHONHASHSEED", "random")
    assert main(rerun) == 0
    assert launched.pop().hash_seed is None


def test_a_rerun_of_a_drawn_seed_still_records_it_as_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed a rerun takes from its bundle was drawn by that run's launcher, not given by the
    user: its ranks record it as drawn, so the rerun's bundle keeps the hash-seed limitation
    (a seed the bundle says was given stays given)."""
    from harness.rank.rankfiles import rank_start

    for drawn in (True, False):
        options = RunOptions(nproc_per_node=2, hash_seed=31337, hash_seed_drawn=drawn)
        plan = build_plan(options, tmp_path / f"rerun-{drawn}")
        assert plan.env["PYTHONHASHSEED"] == "31337"
        monkeypatch.setenv("PYTHONHASHSEED", plan.env["PYTHONHASHSEED"])
        start = rank_start(plan=RankPlan.from_environ(plan.env))
        assert (start.hash_seed, start.hash_seed_drawn) == (31337, drawn)
