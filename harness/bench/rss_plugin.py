"""A pytest plugin the bench adds to each suite rank (via PYTEST_ADDOPTS) to record peak RSS.

At the very end of the rank's pytest session it writes `ru_maxrss` of the rank process to
`$DCPQUAL_BENCH_RSS_DIR/rank-NN.json`. Outside that folder nothing changes, so the evidence
bundle of the measured run is exactly what `dcpqual run` writes without the bench. Linux reports
`ru_maxrss` in KiB.
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import pytest

ENV_DIR = "DCPQUAL_BENCH_RSS_DIR"


def peak_rss_kib() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    folder = os.environ.get(ENV_DIR)
    if not folder:
        return
    rank = int(os.environ.get("RANK", "0"))
    record = {"rank": rank, "pid": os.getpid(), "ru_maxrss_kib": peak_rss_kib()}
    path = Path(folder) / f"rank-{rank:02d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
