"""Where the qualification suites are: a checkout's suites/ folder, else the copy an installed
wheel carries as `harness/suites` (setup.py). Torch-free: the launcher and the rank plugin ask."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # harness/


def suites_dir() -> Path | None:
    """The suites folder this harness runs by default, or None when it has none."""
    for candidate in (_PACKAGE.parent / "suites", _PACKAGE / "suites"):
        if (candidate / "conftest.py").is_file():
            return candidate
    return None
