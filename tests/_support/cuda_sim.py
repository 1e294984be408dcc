"""A CUDA stream and graph world on a CPU machine, with no b12x: the `torch.cuda` calls a
`CaptureWindow` makes (`cuda=`), recorded in order in `calls`. `graph(...)` turns capturing on
for its body and `stream(s)` makes `s` current, so code that reads the current stream or the
capture state (b12x's pool, in `_support.b12x_sim`) sees what a GPU would give it.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

_ids = itertools.count(0x1000, 0x100)


class SimStream:
    """A CUDA stream handle: b12x keys channels by `cuda_stream`."""

    def __init__(self, calls: list[str], name: str) -> None:
        self.calls, self.name, self.cuda_stream = calls, name, next(_ids)

    def wait_stream(self, other: SimStream) -> None:
        self.calls.append(f"{self.name}.wait_stream({other.name})")


class SimGraph:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        calls.append("CUDAGraph()")

    def replay(self) -> None:
        self.calls.append("graph.replay")

    def pool(self) -> tuple[int, int]:
        return (1, 2)

    def reset(self) -> None:
        self.calls.append("graph.reset")


class SimCuda:
    """The current stream and capture state b12x reads, and the graph API the window calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.default = SimStream(self.calls, "default")
        self.current = self.default
        self.capturing = False

    def Stream(self, device: Any = None) -> SimStream:
        self.calls.append("Stream()")
        return SimStream(self.calls, "side")

    def current_stream(self, device: Any = None) -> SimStream:
        return self.current

    @contextlib.contextmanager
    def stream(self, stream: SimStream) -> Iterator[None]:
        previous, self.current = self.current, stream
        self.calls.append(f"enter stream({stream.name})")
        try:
            yield
        finally:
            self.current = previous
            self.calls.append(f"exit stream({stream.name})")

    def CUDAGraph(self) -> SimGraph:
        return SimGraph(self.calls)

    @contextlib.contextmanager
    def graph(self, graph: SimGraph, *, stream: SimStream, capture_error_mode: str):
        previous, self.current = self.current, stream
        self.capturing = True
        self.calls.append(f"enter graph(stream={stream.name})")
        try:
            yield
        finally:
            self.capturing = False
            self.current = previous
            self.calls.append("exit graph")
