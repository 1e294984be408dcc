"""Where a secret survived: the files of a bundle whose name or bytes hold it, and the mark for
tests that signal the launcher (signal handlers can only be set from the main thread)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from harness.evidence.files import walk

main_thread_only = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="needs the main thread"
)


def leaks(root: Path, *secrets: str) -> list[str]:
    """Files under `root` whose name or bytes hold any of `secrets` (stripped)."""
    found = []
    for entry in walk(root):
        data = entry.path.read_bytes() if entry.kind == "file" else b""
        for secret in secrets:
            core = secret.strip()
            if core in entry.relpath or core.encode() in data:
                found.append(f"{entry.relpath}: {core[:12]}...")
    return found
