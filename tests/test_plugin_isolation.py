"""The rank side stays self-contained: the plugin loads no controller or evidence code."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import harness.rank.plugin
bad = sorted(m for m in sys.modules if m.startswith("harness.evidence")
             or m in ("harness.launch.launcher", "harness.launch.plan", "harness.launch.collect",
                      "harness.launch.progress", "harness.launch.nodes", "harness.launch.cli"))
print(",".join(bad))
"""


def test_plugin_imports_no_controller_or_evidence_module(repo_root):
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=repo_root, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == ""
