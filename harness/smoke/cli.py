"""`dcpqual gpu-smoke`: the one-GPU smoke of the GPU paths, with an evidence bundle.

Everything that can refuse the run is checked before the out folder is made: a machine without
a usable CUDA device (or without NCCL) gets one line on stderr and exit 2, and nothing is
written. Exit 0 only when the capture passed and every negative control fired, and the bundle's
own verdict agrees; 1 otherwise. Torch and the smoke's modules load only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.schema.layout import SUMMARY_NAME

DESCRIPTION = (
    "One process (world 1, NCCL) on one CUDA device, against the torch installed here: warm a "
    "stand-in Kimi-K3 decode step, capture it with a real torch.cuda.graph in a strict window, "
    "replay it with fresh inputs against eager and a reference, then make each GPU detector's "
    "negative control fire inside a real capture (cuda-memory, triton-jit, process-groups, "
    "transport-registry). Writes an evidence bundle (default evidence/<UTC time>-<id>/). Exit 0 "
    "only when the capture passed and every control fired; 2 without a CUDA device."
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "gpu-smoke",
        help="one-GPU smoke: real CUDA-graph capture and the GPU detectors' negative controls",
        description=DESCRIPTION,
    )
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="evidence folder (new)")
    p.add_argument(
        "--device", default="cuda", metavar="DEV", help="CUDA device, e.g. cuda:1 (default cuda)"
    )
    p.set_defaults(func=run_gpu_smoke)


def cuda_problem(device: str) -> str | None:
    """Why the smoke cannot run on `device` here, or None when it can."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return f"torch is not importable ({exc}); the smoke runs against an installed CUDA torch"
    try:
        wanted = torch.device(device)
    except (RuntimeError, ValueError):
        return f"--device {device!r} is not a device name (expected cuda or cuda:N)"
    if wanted.type != "cuda":
        return f"--device {device!r} is not a CUDA device; the smoke needs one"
    if not torch.cuda.is_available():
        return (
            f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}) "
            "sees no GPU, and the smoke needs one"
        )
    count = torch.cuda.device_count()
    if wanted.index is not None and not 0 <= wanted.index < count:
        return f"--device {device}: this machine has {count} CUDA device(s)"
    if not dist.is_available() or not dist.is_nccl_available():
        return f"torch {torch.__version__} has no NCCL backend; the smoke runs one NCCL rank"
    return None


def run_gpu_smoke(args: argparse.Namespace) -> int:
    problem = cuda_problem(args.device)
    if problem is not None:
        raise UsageError(problem)
    from harness.evidence.writer import default_out_dir, prepare_out_dir

    out = prepare_out_dir(args.out if args.out is not None else default_out_dir())
    from harness.smoke.bundle import write_smoke_bundle
    from harness.smoke.run import SmokeConfig, run_smoke

    result = run_smoke(SmokeConfig(device=args.device))
    receipt = write_smoke_bundle(out, result, command=["dcpqual", *sys.argv[1:]])
    print(report(result, receipt, out))
    return 0 if result.passed and receipt.verdict == "pass" else 1


def report(result: Any, receipt: Any, out: Path) -> str:
    """What the command prints: one line per check, the verdict, then summary.md."""
    from harness.schema.smoke import smoke_tests

    machine = result.machine
    lines = [
        f"gpu-smoke on {machine.device_name} ({machine.sm}, {machine.device}), torch "
        f"{machine.torch}, CUDA {machine.cuda}, triton {machine.triton or 'none'}",
    ]
    for test in smoke_tests(result):
        mark = "PASS" if test.outcome == "passed" else "FAIL"
        lines.append(f"  {mark} {test.nodeid}" + (f": {test.message}" if test.message else ""))
    for control in result.controls:
        events = ", ".join(sorted({f"{e.detector}@{e.phase}" for e in control.events}))
        ending = f"; capture ended: {control.error[:200]}" if control.error else ""
        lines.append(
            f"  control {control.detector}: work done {control.happened}x, events [{events}]"
            + ending
        )
    lines.append(f"verdict {receipt.verdict} ({receipt.status}); evidence: {out}")
    summary = out / SUMMARY_NAME
    if summary.is_file():
        lines.extend(["", summary.read_text(encoding="utf-8")])
    return "\n".join(lines)
