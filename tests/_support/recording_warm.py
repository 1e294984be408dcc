"""A warm implementation named by dotted path, for `--warm-impl` in the showcase test.

It lives apart from the test modules: the ranks import it with only the rank plugins loaded, so
it must not carry another plugin's marks (a test module's `xdist_group` would be refused there).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness.warm.warmup import WarmReport, warm

MARKS_ENV = "DCPQUAL_TEST_WARM_MARKS"


def recording_warm(model: Any, **kwargs: Any) -> WarmReport:
    """The vendored warmup, leaving a mark per rank."""
    marks = Path(os.environ[MARKS_ENV])
    (marks / f"rank-{os.environ['RANK']}").write_text(type(model).__name__ + "\n")
    return warm(model, **kwargs)
