"""The oracle for a rank's recorded hash probe: a fresh interpreter's hash under a given seed."""

from __future__ import annotations

import subprocess
import sys

from harness.schema.rank_record import HASH_PROBE


def probe_under(seed: int) -> int:
    """What an interpreter started with PYTHONHASHSEED=`seed` hashes the probe to (a fresh
    interpreter, not the harness)."""
    code = "import sys; print(hash(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-S", "-c", code, HASH_PROBE],
        env={"PYTHONHASHSEED": str(seed)},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)
