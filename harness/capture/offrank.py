"""The dynamo negative controls, run once per run in one short-lived child process, not on
every rank.

The dynamo control needs `torch.compile`, so a rank that runs it imports `torch._dynamo` (and
sympy): seconds of CPU and tens of MB on each of 16 ranks, for a control that needs no process
group and whose outcome cannot differ between ranks of one image. The lowest rank starts the
child in the background as soon as its tests are collected; the child runs exactly what the
per-detector control does on a rank (`run_control`: a fresh registry and the default detectors,
the control provoked inside a record-mode window, once with every detector and once with the
dynamo detector removed) and prints both outcomes as JSON. The control's test on that rank turns
them into its verdict and its capture record; the other ranks contribute no window of their own.

Run as `python -m harness.capture.offrank --detector dynamo --device cpu --rank 0 --world-size 16`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from pydantic.dataclasses import dataclass

from harness.capture.events import LazyEvent
from harness.errors import QualificationError
from harness.schema.base import JsonValue
from harness.schema.capture import STRICT, DetectorStatus

OFF_RANK: tuple[str, ...] = ("dynamo",)
VARIANTS: tuple[str, ...] = ("detected", "detector-removed")


@dataclass(frozen=True, config=STRICT)
class ControlOutcome(JsonValue):
    """What one control window showed: work done by the control's own count, the detectors
    that reported it, and the window's events and detector statuses (for its capture record)."""

    done: int
    seen: tuple[str, ...]
    path: str
    events: tuple[LazyEvent, ...]
    statuses: tuple[DetectorStatus, ...]


def run_control(
    detector: str, *, removed: bool, device: Any, rank: int, world_size: int
) -> ControlOutcome:
    """One negative-control window for `detector`, in this process (see the module doc)."""
    import torch

    from harness.capture.check import default_detectors
    from harness.capture.controls import CONTROLS, ControlContext
    from harness.capture.detector import without
    from harness.capture.window import CaptureWindow
    from harness.transport.registry import TransportRegistry

    device = torch.device(device)
    with TransportRegistry("torch", device=device) as registry:
        detectors = default_detectors(registry, device=device)
        control = CONTROLS[detector](ControlContext(registry, device, rank, world_size))
        control.setup()
        if removed:
            detectors = without(detectors, detector)
        window = CaptureWindow(
            detectors, registry=registry, mode="record", warmup_iters=0, rank=rank
        )

        def step(inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
            control.provoke()
            return inputs[0] * 2

        before = control.happened()
        captured = window.capture(step, torch.ones(4, device=device))
        return ControlOutcome(
            done=control.happened() - before,
            seen=tuple(sorted({e.detector for e in window.events})),
            path=captured.path,
            events=window.events,
            statuses=window.statuses,
        )


class OffRankControls:
    """The child process running one detector's controls; `outcomes()` waits for it."""

    def __init__(self, detector: str, process: subprocess.Popen[str]) -> None:
        self.detector = detector
        self.process = process
        self._outcomes: dict[str, ControlOutcome] | None = None

    @classmethod
    def start(cls, detector: str, *, device: str, rank: int, world_size: int) -> OffRankControls:
        argv = [sys.executable, "-m", "harness.capture.offrank", "--detector", detector]
        argv += ["--device", device, "--rank", str(rank), "--world-size", str(world_size)]
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        return cls(detector, process)

    def outcomes(self, timeout_s: float) -> dict[str, ControlOutcome]:
        """Both variants' outcomes; a child that fails or prints no result is an error here."""
        if self._outcomes is None:
            try:
                out, err = self.process.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.close()
                raise QualificationError(
                    f"the {self.detector} controls' process gave no result in {timeout_s:g}s"
                ) from None
            lines = out.strip().splitlines()
            if self.process.returncode != 0 or not lines:
                tail = " | ".join(err.strip().splitlines()[-3:])
                raise QualificationError(
                    f"the {self.detector} controls' process exited {self.process.returncode}: "
                    f"{tail or 'no output'}"
                )
            data = json.loads(lines[-1])
            self._outcomes = {v: ControlOutcome.from_json(data[v]) for v in VARIANTS}
        return self._outcomes

    def close(self) -> None:
        """End the child if it is still running (a session that stopped before its test)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.capture.offrank")
    parser.add_argument("--detector", choices=OFF_RANK, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    args = parser.parse_args(argv)
    outcomes = {
        variant: run_control(
            args.detector,
            removed=variant == "detector-removed",
            device=args.device,
            rank=args.rank,
            world_size=args.world_size,
        ).to_json()
        for variant in VARIANTS
    }
    print(json.dumps(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
