"""Whether a preloaded forkserver may fork ranks (`harness.rank.forksafety`): its CUDA check, with
a fake torch and fake memory maps, and its thread count, read from /proc as a forked child of
the server reads it."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.rank import forksafety
from harness.rank.forksafety import cuda_refusal, loaded_libraries, native_threads

MAPS = """\
55d0c0a00000-55d0c0a2c000 r--p 00000000 08:01 1234 /usr/bin/python3.11
7f1c2a000000-7f1c2a200000 r-xp 00000000 08:01 2345 /opt/torch/lib/libtorch_cpu.so
7f1c2b000000-7f1c2b100000 r-xp 00000000 08:01 3456 /usr/local/cuda/lib64/libcudart.so.12
7f1c2c000000-7f1c2c021000 rw-p 00000000 00:00 0
7ffd5e1f0000-7ffd5e211000 rw-p 00000000 00:00 0 [stack]
"""
DRIVER = "7f1c2d000000-7f1c2d800000 r-xp 00000000 08:01 4567 /usr/lib/x86_64/libcuda.so.1\n"


def _torch(initialized: bool) -> SimpleNamespace:
    return SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: initialized))


@pytest.fixture
def maps(tmp_path: Path):
    def write(text: str) -> str:
        path = tmp_path / "maps"
        path.write_text(text)
        return str(path)

    return write


def test_a_server_that_never_touched_cuda_may_fork(maps) -> None:
    # The CUDA runtime and torch's own libraries are loaded by `import torch`: no refusal.
    assert cuda_refusal(_torch(False), maps(MAPS)) is None
    assert cuda_refusal(None, maps(MAPS)) is None


def test_a_loaded_cuda_driver_refuses_the_fork_though_torch_says_not_initialized(maps) -> None:
    """What `torch.cuda.is_available()` or `device_count()` leave: the driver loaded,
    `is_initialized()` still false."""
    reason = cuda_refusal(_torch(False), maps(MAPS + DRIVER))
    assert reason is not None and "/usr/lib/x86_64/libcuda.so.1" in reason
    deleted = DRIVER.replace("libcuda.so.1\n", "libcuda.so.550.54 (deleted)\n")
    assert cuda_refusal(None, maps(MAPS + deleted)) is not None


def test_torchs_own_word_that_cuda_is_initialized_refuses_the_fork(maps) -> None:
    reason = cuda_refusal(_torch(True), maps(MAPS))
    assert reason is not None and "initialized" in reason


def test_only_the_driver_itself_counts(maps) -> None:
    near = (
        MAPS
        + DRIVER.replace("libcuda.so.1", "libcudart.so.1")
        + DRIVER.replace("libcuda.so.1", "libcuda_stub.so")
    )
    assert loaded_libraries(("libcuda.so",), maps(near)) == []
    assert loaded_libraries(("libcuda.so",), "/nonexistent/maps") == []


def test_this_process_maps_are_read() -> None:
    """The real /proc/self/maps parses: the C library is in it."""
    assert loaded_libraries(("libc.so",)) != []


def test_a_thread_in_the_server_is_counted_from_its_child() -> None:
    """A forked child has one thread whatever its parent has: it counts its parent's."""
    before = native_threads()
    assert before is not None
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert native_threads() == before + 1
        context = multiprocessing.get_context("fork")
        answer, send = context.Pipe(duplex=False)
        child = context.Process(target=_threads_of_parent, args=(send,))
        child.start()
        counted = answer.recv()
        child.join()
    finally:
        stop.set()
        thread.join()
    assert counted == (before + 1, 1)  # the parent's, and the child's own one
    assert native_threads(2**22 + 7) is None  # no such process: nothing counted


def _threads_of_parent(send) -> None:
    import os

    send.send((native_threads(os.getppid()), native_threads()))
    send.close()


def test_a_server_with_one_thread_and_no_cuda_may_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forksafety, "native_threads", lambda pid=None: 1)
    monkeypatch.setattr(forksafety, "cuda_refusal", lambda torch: None)
    assert forksafety.refusal_in_forkserver_child() is None
    monkeypatch.setattr(forksafety, "native_threads", lambda pid=None: 3)
    reason = forksafety.refusal_in_forkserver_child()
    assert reason is not None and reason.startswith("3 threads alive in the forkserver")
    monkeypatch.setattr(forksafety, "native_threads", lambda pid=None: None)  # no /proc
    monkeypatch.setattr(forksafety, "cuda_refusal", lambda torch: "CUDA is initialized")
    assert forksafety.refusal_in_forkserver_child() == "CUDA is initialized"
