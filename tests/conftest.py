"""Fixtures shared by the harness's unit and acceptance tests."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from _support.runs import Launched
    from _support.watchdog import SigtermPipe, World

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that launch most real runs first, each file's own order kept: `nox -s tests`
    hands whole files to its workers in this order (`--dist loadfile --no-loadscope-reorder`),
    and a long file handed out last keeps one worker busy while the others have nothing left."""
    launches = Counter(item.path for item in items if item.get_closest_marker("torchrun"))
    first_seen = {path: n for n, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-launches[item.path], first_seen[item.path]))


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


# -- real `dcpqual run` launches that several test modules read ------------------------------
# Each is launched once per session, for the tests that read different facts of the same run,
# however many xdist workers run its readers (`_support.runs.launched_once`).


@pytest.fixture(scope="session")
def rank_assert_run(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """tests/rank_suites/rank_assert.py on 2 ranks, its flags spelled as torchrun and vLLM spell
    them (`--nproc_per_node`, `--tensor-parallel-size`): rank 1 fails `test_fault`, after
    `test_before` passed. Read by tests/test_run_ux.py (the ending it prints, and its rerun)
    and tests/test_reliability_bodies.py (a failing run whose test bodies ran)."""
    from _support.runs import SUITES, launch_printing, launched_once

    def launch(folder: Path) -> Launched:
        out = folder / "first"
        argv = ["run", "--nproc_per_node", "2", "--tensor-parallel-size", "2", "--out", str(out)]
        return launch_printing(out, [*argv, "--", str(SUITES / "rank_assert.py")])

    return launched_once(tmp_path_factory, "rank-assert", launch)


@pytest.fixture(scope="session")
def before_kimi_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seed change's "before": one real run of the Kimi-K3 capture check with the warm code
    that does not know Kimi-K3 (it fails, the signature created lazily in capture). Shared by
    every test that reads it; a test that edits a bundle edits its own copy."""
    from _support.runs import Launched, kimi_capture_run, launched_once

    def launch(folder: Path) -> Launched:
        done = kimi_capture_run(folder / "bundle", "before-kimi")
        return Launched((done.returncode,), folder / "bundle", done.stdout + done.stderr)

    launched = launched_once(tmp_path_factory, "before-kimi", launch)
    assert launched.codes == (1,), launched.printed[-6000:]
    return launched.out


# vLLM's CPU worker replaces these of torch.cuda when it is imported (vllm/v1/worker/cpu/shm.py:
# placeholders for a CPU build); a test that imports it in this process must not change the
# torch every later test of the process sees.
VLLM_REPLACES_IN_TORCH_CUDA = ("Stream", "current_stream", "stream")


@pytest.fixture(autouse=True)
def _torch_cuda_as_it_was() -> Iterator[None]:
    torch = sys.modules.get("torch")  # never imported here for a test that does not
    kept = (
        None if torch is None else {n: getattr(torch.cuda, n) for n in VLLM_REPLACES_IN_TORCH_CUDA}
    )
    yield
    if torch is not None and kept is not None:
        for name, value in kept.items():
            setattr(torch.cuda, name, value)
