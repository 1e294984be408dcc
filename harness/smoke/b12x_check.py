"""The b12x channel/capture sequence on a GPU machine, or a plain line saying why it could not run.

`python -m harness.smoke.b12x_check [--out DIR] [--timeout S]` (run by tools/gpu-smoke.sh and
`nox -s gpu1` after the one-GPU smoke): where b12x can run (an sm_12x GPU, b12x importable, at
least two visible devices: b12x's DCP collectives need world size 2 or more) it runs the capture
suite's Kimi-K3 check on two NCCL ranks (`dcpqual run --nproc-per-node 2 --backend nccl`), where
the stand-in suites select the b12x transport: pool creation, the eager channel, the graph
channel entered with `pool.capture()` before the window's warm-up and `torch.cuda.graph`, plans
prepared per channel, replay checked against eager and the reference. Elsewhere it prints
`b12x: NOT RUN: ...` with the reason (the GPU's generation, b12x missing, one device) and exits 0:
not running is the expected outcome there, and the line says so plainly.

Exit: 0 when it passed or could not run here, 1 when it ran and failed, 124 at the time limit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from harness.transport.b12x_backend import DeviceFacts, b12x_usable, device_facts

B12X_DCP = 2
SUITE = "suites/capture/test_capture.py::test_capture_has_no_lazy_work[kimi-k3]"


@dataclass(frozen=True)
class B12xSmokePlan:
    """Whether the b12x sequence runs here, why, and the command that runs it."""

    run: bool
    reason: str
    command: tuple[str, ...] = ()

    def line(self) -> str:
        if self.run:
            return f"b12x: RUN on 2 ranks ({self.reason}): {' '.join(self.command)}"
        return f"b12x: NOT RUN: the b12x channel/capture sequence could not run here: {self.reason}"


def plan(
    facts: DeviceFacts, *, out: str | None = None, python: str = sys.executable
) -> B12xSmokePlan:
    """The decision, a pure function of the device's facts (tests feed fakes)."""
    usable, reason = b12x_usable(facts)
    if not usable:
        return B12xSmokePlan(False, reason)
    command = [python, "-m", "harness", "run", "--nproc-per-node", str(B12X_DCP)]
    command += ["--backend", "nccl", "--tp", "16", "--dcp", str(B12X_DCP)]
    if out:
        command += ["--out", out]
    return B12xSmokePlan(True, reason, (*command, "--", SUITE))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.smoke.b12x_check")
    parser.add_argument("--out", default=None, help="evidence folder of the 2-rank run")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds (default 420)")
    args = parser.parse_args(argv)
    chosen = plan(device_facts(), out=args.out)
    print(chosen.line(), flush=True)
    if not chosen.run:
        return 0
    try:
        done = subprocess.run(chosen.command, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"b12x: FAIL: the 2-rank run passed its {args.timeout:.0f} s limit", flush=True)
        return 124
    verdict = "PASS" if done.returncode == 0 else f"FAIL (exit {done.returncode})"
    print(f"b12x: {verdict}: the b12x channel/capture sequence on 2 ranks", flush=True)
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
