"""Root conftest: shared by the harness's own tests (tests/) and never by the rank suites.

The qualification suites under suites/ run only on ranks under torchrun, with the rank plugin
(`-p harness.rank.plugin`); a plain `pytest` in the repository must not collect them.
"""

from __future__ import annotations

import os

collect_ignore = [] if os.environ.get("DCPQUAL_RANK_PLUGIN") == "1" else ["suites"]
