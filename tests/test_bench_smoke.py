"""Acceptance: `dcpqual bench --quick` at 2 gloo ranks, the real CLI and a real torchrun launch.

The launch, real and engine sections (full suite runs) are skipped to keep this short; the
others run at the smallest sizes. Only structure is checked, never timings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.schema.bench import BenchReport

pytestmark = [pytest.mark.torchrun]

SMALL = (
    "--quick", "--skip", "launch,real,engine", "--batches", "1", "--iters", "2",
    "--capture-iters", "4", "--lookup-rounds", "2", "--lookup-loops", "50", "--modules", "1000",
    "--discovery-repeats", "1", "--timeout", "240",
)  # fmt: skip


def test_quick_bench_writes_schema_v1_and_prints_tables(tmp_path: Path, repo_root: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "bench", "--out", str(out), *SMALL],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["schema"] == "dcpqual-bench/v1" and data["complete"] is True
    transport = data["results"]["transport"]
    assert transport["world_size"] == 2
    assert [(c["strategy"], c["batch"]) for c in transport["cases"]] == [("ag_rs", 1), ("a2a", 1)]
    assert transport["cases"][0]["ratio"]["paired"]["n"] == 2
    assert data["results"]["capture"]["overhead_pct"] == pytest.approx(
        (data["results"]["capture"]["step_ratio"]["after_window"]["value"] - 1) * 100
    )
    BenchReport.model_validate(data)  # the file is what the committed schema describes
    assert data["results"]["discovery"]["modules"] >= 1000
    assert data["results"]["launch"] is None and data["results"]["real"] is None
    assert data["results"]["engine"] is None
    outcomes = {t["key"]: t["outcome"] for t in data["targets"]}
    assert outcomes["suite_vs_bare_launch"] == "not-measured"
    assert outcomes["peak_rss_per_rank"] == "not-measured"
    assert outcomes["peak_rss_per_rank_real"] == "not-measured"
    assert outcomes["real_vs_bare_real_launch"] == "not-measured"
    assert outcomes["engine_run_s"] == outcomes["peak_rss_per_rank_engine"] == "not-measured"
    assert "Targets" in done.stdout and "transport_overhead" in done.stdout
