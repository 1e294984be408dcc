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
