"""The project's showcase, end to end on gloo: the seed change, before and after.

`dcpqual run --warm-impl before-kimi` fails with the Kimi-K3 signature (96 heads x 576 -> 512)
created lazily inside capture; `--warm-impl vendored` passes; `dcpqual compare` shows exactly that
difference. Run here at 2 ranks (tp = dcp = 2, where Kimi still has 96 heads); the README gives
the same pair at 16 ranks. Also: `--warm-impl package.module:function` runs the named callable
on every rank (`tests/_support/recording_warm.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _support import forked_cli
from _support.recording_warm import MARKS_ENV
from _support.runs import KIMI_WORLD as WORLD
from _support.runs import kimi_capture_run

from harness.qualify.compare import compare_bundles, load_bundle

pytestmark = [pytest.mark.torchrun, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parent.parent
KIMI = "96 heads x 576 -> 512"
DOTTED = "_support.recording_warm:recording_warm"


def dcpqual_compare(base: Path, head: Path, *form: str) -> subprocess.CompletedProcess[str]:
    return forked_cli.run(["compare", str(base), str(head), *form], cwd=REPO_ROOT)


def receipt(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "receipt.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, before_kimi_bundle: Path) -> dict[str, Path]:
    after = tmp_path_factory.mktemp("showcase") / "vendored"
    done = kimi_capture_run(after, "vendored")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"before-kimi": before_kimi_bundle, "vendored": after}


def test_before_kimi_fails_with_the_kimi_signature_created_lazily(runs: dict[str, Path]) -> None:
    r = receipt(runs["before-kimi"])
    assert (r["verdict"], r["warm_impl"]) == ("fail", "before-kimi")
    (row,) = [s for s in r["signatures"] if s["model"] == "kimi-k3"]
    shape = (row["total_heads"], row["query_head_dim"], row["output_head_dim"])
    assert shape == (96, 576, 512)
    assert (row["warmed"], row["used_in_capture"]) == (False, True)
    assert r["capture"]["lazy_events"] >= 1
    assert all(KIMI in (e["signature"] or "") for e in r["capture"]["events"])
    assert r["root_cause"] is not None and KIMI in r["root_cause"]["message"]


def test_vendored_passes_with_kimi_warmed(runs: dict[str, Path]) -> None:
    r = receipt(runs["vendored"])
    assert (r["verdict"], r["warm_impl"], r["capture"]["lazy_events"]) == ("pass", "vendored", 0)
    (row,) = [s for s in r["signatures"] if s["model"] == "kimi-k3"]
    assert (row["total_heads"], row["warmed"], row["used_in_capture"]) == (96, True, True)


def test_compare_shows_exactly_the_seed_change(runs: dict[str, Path]) -> None:
    after, before = runs["vendored"], runs["before-kimi"]
    c = compare_bundles(load_bundle(after), load_bundle(before))
    (kimi,) = [s for s in c.signatures if s.model == "kimi-k3"]
    assert kimi.signature.startswith(KIMI)
    assert c.regressions == (
        "verdict pass -> fail",
        "status source-qualified -> not-qualified",
        "suite capture: failed+errors 0 -> 1",
        f"lazy events in capture (transport-registry, {kimi.signature}): 0 -> {WORLD}",
        f"kimi-k3 {kimi.signature}: used in capture but not warmed",
    )
    assert [s.change for s in c.signatures] == ["changed"]
    # Sources may move between the runs when the tree is being edited. Besides the warm code,
    # only the transports that ran differ: the strict window stops the lazy Kimi creation at
    # the registry miss, so the before-kimi run created no transport at all.
    others = {x.field: (x.base, x.head) for x in c.identity if not x.field.startswith("sources.")}
    assert others == {"warm_impl": ("vendored", "before-kimi"), "transports": ("torch:ag_rs", "")}

    worse = dcpqual_compare(after, before, "--markdown")
    assert worse.returncode == 1, worse.stderr
    assert worse.stdout.startswith("### dcpqual compare: REGRESSION")
    assert c.base.receipt_sha256 in worse.stdout and c.head.receipt_sha256 in worse.stdout
    fixed = dcpqual_compare(before, after, "--json")
    assert fixed.returncode == 0, fixed.stderr
    data = json.loads(fixed.stdout)
    assert data["regressed"] is False and "verdict fail -> pass" in data["improvements"]


def test_warm_impl_by_dotted_path_runs_on_every_rank(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    path = os.pathsep.join(
        p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p
    )
    env = {"PYTHONPATH": path, MARKS_ENV: str(marks)}
    done = kimi_capture_run(tmp_path / "bundle", DOTTED, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in marks.iterdir()) == [f"rank-{r}" for r in range(WORLD)]
    r = receipt(tmp_path / "bundle")
    assert (r["verdict"], r["warm_impl"]) == ("pass", DOTTED)
