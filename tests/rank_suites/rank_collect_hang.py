"""The fault rank hangs while pytest imports this file (collection); its peers collect at once
and wait for it at the collection check."""

from __future__ import annotations

import os
import time

if os.environ.get("RANK") == os.environ.get("DCPQUAL_FAULT_RANK", "1"):
    time.sleep(600)


def test_never_reached_by_the_hung_rank():
    pass
