"""Every test passes, and one leaves a child that ends by itself 1.5 s after torchrun exited:
while the ranks' output relays, which the child's inherited output holds open, would finish."""

from __future__ import annotations

import subprocess
import sys

from harness.rank.parentage import agent_pid

LEFT: list[subprocess.Popen[bytes]] = []
# The child: wait for the torchrun agent (given by pid) to be gone, then 1.5 s more. On a busy
# machine the agent can be gone before the child has even imported psutil: it still waits.
CHILD = """
import sys, time
import psutil
try:
    psutil.wait_procs([psutil.Process(int(sys.argv[1]))])
except psutil.NoSuchProcess:
    pass
time.sleep(1.5)
"""


def test_leaves_a_child_that_ends_after_torchrun():
    LEFT.append(subprocess.Popen([sys.executable, "-c", CHILD, str(agent_pid())]))
