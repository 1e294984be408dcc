"""Where a secret survived: the files of a bundle whose name or bytes hold it, and the mark for
tests that signal the launcher (signal handlers can only be set from the main thread)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from _support.runs import records
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


def pieces_in(text: str, secret: str, size: int) -> list[str]:
    """The pieces of `secret`, `size` characters long, that `text` holds: what a printer that
    cut a long value short (an ellipsis, a diff's skipped characters) left of it."""
    return sorted(_grams(secret, size) & _grams(text, size))


def _grams(text: str, size: int) -> set[str]:
    return {text[i : i + size] for i in range(len(text) - size + 1)}


def pieces_left(root: Path, secret: str, size: int) -> list[str]:
    """Files under `root` whose name or text holds a piece of `secret` `size` characters long."""
    found = []
    for entry in walk(root):
        data = entry.path.read_bytes() if entry.kind == "file" else b""
        text = entry.relpath + "\n" + data.decode("utf-8", "replace")
        if pieces_in(text, secret, size):
            found.append(f"{entry.relpath}: {pieces_in(text, secret, size)}")
    return found


def signal_when_running(
    out: Path, world: int, test: str, *sigs: signal.Signals
) -> threading.Thread:
    """Send this process (the launcher) `sigs`, with nothing between them, once all `world`
    ranks are inside `test`: the later ones arrive while the first one's ending is prepared."""

    def wait_then_signal() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                recs = records(out)
            except (OSError, ValueError):
                recs = {}
            running = [r.current_test or "" for r in recs.values()]
            if len(running) == world and all(t.endswith(f"::{test}") for t in running):
                break
            time.sleep(0.2)
        for sig in sigs:
            os.kill(os.getpid(), sig)

    thread = threading.Thread(target=wait_then_signal, daemon=True)
    thread.start()
    return thread
