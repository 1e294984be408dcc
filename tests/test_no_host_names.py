"""No machine's name in what a reviewer of the fork reads: a run on a host with a distinctive
name leaves it in the rank records (verify re-derives the receipt's host digests from them) and
nowhere in summary.md, the receipt, the merged JUnit report or `dcpqual compare`'s output."""

from __future__ import annotations

import json
import platform
import socket
from pathlib import Path

import pytest
from _support.evidence_factory import context, torchrun_logs, write_rank

from harness.evidence.environment import host_digest
from harness.evidence.verify import verify_bundle
from harness.evidence.writer import finalize_bundle
from harness.qualify.compare import compare_bundles, load_bundle
from harness.qualify.nightly import write_report
from harness.qualify.report import render_markdown, render_text
from harness.schema.compare import NightlyResult

NODE = "zebra-7731.gpu-lab.internal"
RANK_NODE = "okapi-0042.gpu-lab.internal"
KERNEL = "6.99.0-4242-dcpqual-test"


@pytest.fixture
def bundles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Two bundles written on a host called NODE whose ranks ran on RANK_NODE."""
    monkeypatch.setattr(socket, "gethostname", lambda: NODE)
    monkeypatch.setattr(platform, "node", lambda: NODE)
    monkeypatch.setattr(platform, "release", lambda: KERNEL)
    out = []
    for name in ("base", "head"):
        bundle = tmp_path / name
        bundle.mkdir()
        for rank in range(2):
            write_rank(bundle, rank, 2, hostname=RANK_NODE)
        torchrun_logs(bundle, 2)
        finalize_bundle(bundle, context(2))
        out.append(bundle)
    return out[0], out[1]


def _pr_files(base: Path, head: Path, report: Path) -> dict[str, str]:
    """Every file or text meant for a pull request: the summaries, compare's three forms and
    what the nightly report folder holds outside the bundle copy."""
    comparison = compare_bundles(load_bundle(base), load_bundle(head))
    result = NightlyResult(
        archive=base.parent,
        bundle=head,
        previous=base,
        step_exit_codes=(0,),
        problems=(),
        skipped_previous=(),
        verdict="pass",
        comparison=comparison,
    )
    write_report(result, report)
    files = {
        "base/summary.md": (base / "summary.md").read_text(),
        "head/summary.md": (head / "summary.md").read_text(),
        "compare --markdown": render_markdown(comparison),
        "compare (text)": render_text(comparison),
        "compare --json": json.dumps(comparison.to_json()),
    }
    for path in sorted(report.iterdir()):
        if path.is_file():
            files[f"nightly report/{path.name}"] = path.read_text()
    return files


def test_no_host_name_or_uname_data_in_anything_meant_for_a_pull_request(
    bundles: tuple[Path, Path], tmp_path: Path
) -> None:
    base, head = bundles
    # The names did reach the run (else this test could not fail): the raw rank records keep
    # the rank's host, which verify needs to re-derive the receipt's digests.
    assert RANK_NODE in (base / "records" / "rank-00.json").read_text()
    files = _pr_files(base, head, tmp_path / "report")
    files["receipt.json"] = (head / "receipt.json").read_text()
    files["junit/merged.xml"] = (head / "junit" / "merged.xml").read_text()
    assert len(files) >= 8
    for name, text in files.items():
        for needle in (NODE, RANK_NODE, "zebra", "okapi", KERNEL):
            assert needle not in text, f"{needle!r} in {name}"
    receipt = json.loads(files["receipt.json"])
    assert receipt["environment"]["host"] == host_digest(NODE)
    assert receipt["environment"]["hosts"] == [host_digest(RANK_NODE)]
    assert receipt["environment"]["platform"] == f"{platform.system()}-{platform.machine()}"
    assert verify_bundle(head).ok


def test_the_host_digest_is_stable_and_tells_hosts_apart() -> None:
    assert host_digest(NODE) == host_digest(NODE) != host_digest(RANK_NODE)
    assert host_digest(NODE).startswith("host-") and len(host_digest(NODE)) == 21
    assert NODE not in host_digest(NODE)
