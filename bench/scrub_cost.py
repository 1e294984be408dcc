"""What scrubbing a bundle costs: `scrub_folder` over a stand-in 16 MiB bundle, with the
environment's secrets a run would have.

`python bench/scrub_cost.py [--mib 16] [--repeats 5] [--clean]`. The bundle is 16 ranks' records
(JSON), JUnit reports (XML) and torchrun logs (text), with a few secrets in every file in several
print forms, or with `--clean` none (the ordinary bundle: what every run pays); each repeat scrubs
a fresh copy. Prints the number of forms, the time to build the
scrubber and the median (min-max) time to scrub the folder; then what the ranks' output relays
pay to scrub the same logs as they are written (`LiveScrub`, fed a line at a time, as a rank
with unbuffered output writes them), in MiB per second of one core.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from harness.core.livescrub import LiveScrub
from harness.core.secrets import Scrubber
from harness.evidence.redact import scrub_folder

ENV = {
    "HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "DATABASE_URL": "postgres://qual:s3cr3t-pass-word@db.internal:5432/runs",
    "DB_PASSWORD": 'it\'s "quoted" & <escaped>\\ too',
    "NCCL_DEBUG": "INFO",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
}
RANKS = 16


def _line(i: int) -> str:
    return f"[rank {i % RANKS}] step {i}: gathered 96 heads x 576 in 0.{i % 997:03d} ms, ok\n"


def write_bundle(root: Path, mib: int, *, clean: bool = False) -> None:
    """Three files per rank, together about `mib` MiB, every one holding the secrets unless
    `clean`."""
    per_file = mib * (1 << 20) // (RANKS * 3)
    token = ENV["HF_TOKEN"]
    leaks = [
        f"HF_TOKEN={token}\n",
        f"AssertionError: {token!r}\n",
        f"Authorization: Basic {base64.b64encode(token.encode()).decode()}\n",
    ]
    for rank in range(RANKS):
        lines, size, i = [], 0, 0
        while size < per_file:
            line = leaks[i % 3] if i % 5000 == 0 and not clean else _line(i)
            lines.append(line)
            size += len(line)
            i += 1
        log = root / "torchrun" / f"{rank}" / "stdout.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(lines))
        records = [{"nodeid": f"t::{j}", "message": text} for j, text in enumerate(lines[:20000])]
        (root / "records").mkdir(exist_ok=True)
        (root / "records" / f"rank-{rank:02d}.json").write_text(json.dumps(records)[:per_file])
        cases = "".join(
            f'<testcase name="t{j}" classname="c"><system-out>{text.strip()}</system-out>'
            "</testcase>"
            for j, text in enumerate(lines[: per_file // 120])
        )
        (root / "junit").mkdir(exist_ok=True)
        (root / "junit" / f"rank-{rank:02d}.xml").write_text(
            f'<testsuites><testsuite name="r{rank}">{cases}</testsuite></testsuites>'
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clean", action="store_true", help="a bundle that holds no secret")
    args = parser.parse_args()
    start = time.perf_counter()
    scrubber = Scrubber.from_environ(ENV)
    build = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        write_bundle(source, args.mib, clean=args.clean)
        size = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
        times = []
        for n in range(args.repeats):
            copy = Path(tmp) / f"copy-{n}"
            shutil.copytree(source, copy)
            start = time.perf_counter()
            report = scrub_folder(copy, scrubber)
            times.append(time.perf_counter() - start)
            shutil.rmtree(copy)
        logs = [p.read_bytes() for p in sorted((source / "torchrun").rglob("*.log"))]
    live = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for log in logs:
            scrub = LiveScrub(scrubber)
            for line in log.splitlines(keepends=True):
                scrub.feed(line)
            scrub.end()
        live.append(time.perf_counter() - start)
    log_mib = sum(len(log) for log in logs) / (1 << 20)
    print(f"bundle {size / (1 << 20):.1f} MiB, {len(scrubber.forms)} forms, build {build:.3f} s")
    print(
        f"scrub_folder: median {statistics.median(times):.3f} s "
        f"(min {min(times):.3f}, max {max(times):.3f}), {len(report.changed)} files changed"
    )
    print(
        f"relayed as written: {log_mib:.1f} MiB of logs, a line at a time, "
        f"median {statistics.median(live):.3f} s ({log_mib / statistics.median(live):.1f} MiB/s)"
    )


if __name__ == "__main__":
    main()
