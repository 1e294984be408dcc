"""Whether a preloaded process may fork ranks: one thread alive, CUDA never started.

A child forked from a process with other threads inherits their locks held (a BLAS pool that an
import started), and one forked after CUDA started cannot use it ("Cannot re-initialize CUDA in
forked subprocess"). The agent asks its forkserver this before the first rank
(`harness.launch.agent`) and starts the ranks cold, as torchrun would, where it may not.

Asked in a child the forkserver forked (`refusal_in_forkserver_child`): the child holds the
server's memory and mappings, so what CUDA started there it sees as its own, and it counts the
server's threads in /proc (its own are one, whatever the server's). Standard library only.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# The CUDA driver: the runtime loads it the first time CUDA is asked anything (is_available,
# device_count), and from then on the process holds driver state a forked child cannot use.
CUDA_DRIVER_LIBRARIES = ("libcuda.so",)


def native_threads(pid: int | None = None) -> int | None:
    """Threads of process `pid` (None: this one), as /proc lists them; None where it cannot."""
    try:
        return len(os.listdir(f"/proc/{'self' if pid is None else pid}/task"))
    except OSError:
        return None


def loaded_libraries(names: tuple[str, ...], maps: str = "/proc/self/maps") -> list[str]:
    """The files mapped into this process (`maps`) whose name is one of `names` or a version of
    it (`libcuda.so.1`)."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = set()
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = fields[5].removesuffix(" (deleted)")
        base = os.path.basename(path)
        if any(base == n or base.startswith(n + ".") for n in names):
            found.add(path)
    return sorted(found)


def cuda_refusal(torch: object | None, maps: str = "/proc/self/maps") -> str | None:
    """Why a child forked now could not use CUDA (None: CUDA never started here): torch says it
    initialized CUDA, or the CUDA driver is loaded (which `torch.cuda.is_available()` and
    `device_count()` do without `is_initialized()` turning true)."""
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "CUDA is initialized in the forkserver; a forked child cannot use it"
    drivers = loaded_libraries(CUDA_DRIVER_LIBRARIES, maps)
    if drivers:
        return (
            f"the CUDA driver is loaded in the forkserver ({', '.join(drivers)}): something "
            "asked CUDA about its devices during the preload, and a forked child cannot use the "
            "driver state that left"
        )
    return None


def refusal_in_forkserver_child() -> str | None:
    """In a child the forkserver just forked: why the server may not fork ranks (None: it
    may)."""
    threads = native_threads(os.getppid())
    if threads is not None and threads != 1:
        return (
            f"{threads} threads alive in the forkserver, whose locks a forked child would "
            "inherit held (a thread pool started by the preload where OMP_NUM_THREADS is not 1?)"
        )
    return cuda_refusal(sys.modules.get("torch"))


def answer_refusal(send: Any) -> None:
    """The probe child's whole work: send the refusal (or None) down `send`, a pipe's end."""
    send.send(refusal_in_forkserver_child())
    send.close()
