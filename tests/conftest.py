"""Fixtures shared by the harness's unit and acceptance tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from _support.watchdog import SigtermPipe, World

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def watchdog_world(tmp_path: Path) -> World:
    """Rank 0 of a two-rank world for an in-process watchdog (`_support.watchdog.make`)."""
    from _support.watchdog import open_world  # imports torch: only for the tests that ask

    return open_world(tmp_path)


@pytest.fixture
def sigterm_pipe() -> Iterator[SigtermPipe]:
    """The rank plugin's wakeup pipe; `send()` plays torchrun's SIGTERM."""
    from _support.watchdog import SigtermPipe

    pipe = SigtermPipe()
    yield pipe
    pipe.close()


@pytest.fixture(scope="session")
def before_kimi_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seed change's "before": one real run of the Kimi-K3 capture check with the warm code
    that does not know Kimi-K3 (it fails, the signature created lazily in capture). Shared by
    every test that reads it; a test that edits a bundle edits its own copy."""
    from _support.runs import kimi_capture_run

    out = tmp_path_factory.mktemp("before-kimi") / "bundle"
    done = kimi_capture_run(out, "before-kimi")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    return out
