"""`dcpqual bench --out FILE [--quick] [...]`: parse, validate, hand over to the driver.

Size knobs default to the issue's values (16 ranks, batches 1/8/64, 100,000 modules); `--quick`
swaps in smoke sizes for those not given explicitly.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.bench.targets import SECTIONS
from harness.errors import UsageError
from harness.launch.plan import BACKENDS

DESCRIPTION = (
    "Measure, in one session: transport overhead against raw collectives, the full suite run "
    "against a bare torchrun launch, discovery per module, the capture machinery's eager "
    "overhead outside a window, and peak RSS per rank. Writes JSON (dcpqual-bench/v1) and "
    "prints a table. Targets are reported, never asserted; exit 1 only when a section failed."
)

# option dest -> (flag, type, help); all default to None so that --quick knows what was given.
KNOBS: dict[str, tuple[str, Any, str]] = {
    "nproc": ("--nproc-per-node", int, "ranks (default 16)"),
    "batches": ("--batches", str, "decode batch sizes, comma-separated (default 1,8,64)"),
    "strategies": ("--strategies", str, "reductions, comma-separated (default ag_rs,a2a)"),
    "warmup": ("--warmup", int, "discarded iterations per case (default 5)"),
    "iters": ("--iters", int, "timed iterations per transport case (default 50)"),
    "capture_batch": ("--capture-batch", int, "batch of the capture-overhead step (default 8)"),
    "capture_iters": ("--capture-iters", int, "timed iterations of that step (default 200)"),
    "lookup_rounds": ("--lookup-rounds", int, "rounds of registry lookups (default 21)"),
    "lookup_loops": ("--lookup-loops", int, "lookups per round (default 2000)"),
    "modules": ("--modules", int, "modules of the discovery model (default 100000)"),
    "discovery_repeats": ("--discovery-repeats", int, "timed discoveries (default 7)"),
    "bare_repeats": ("--bare-repeats", int, "bare torchrun launches (default 3)"),
    "suite_repeats": ("--suite-repeats", int, "full dcpqual runs (default 1)"),
    "timeout_s": ("--timeout", float, "seconds per launch (default 3600)"),
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bench", help="measure transport, launch, discovery, capture and memory costs",
        description=DESCRIPTION,
    )  # fmt: skip
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help="results JSON (new)")
    p.add_argument("--quick", action="store_true", help="smoke sizes: 2 ranks, few iterations")
    p.add_argument("--backend", default="gloo", choices=BACKENDS, help="gloo (CPU) or nccl (GPU)")
    p.add_argument(
        "--skip",
        default="",
        metavar="SECTIONS",
        help=f"comma-separated, from {', '.join(SECTIONS)}",
    )
    p.add_argument("--keep-work", action="store_true", help="keep rank logs and suite bundles")
    for dest, (flag, kind, text) in KNOBS.items():
        p.add_argument(flag, dest=dest, type=kind, default=None, help=text)
    p.set_defaults(func=run_command)


def _int_list(flag: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated integers, got {text!r}") from None


def options_from_args(args: argparse.Namespace) -> Any:
    from harness.bench.driver import BenchOptions, with_quick

    given = {dest: getattr(args, dest) for dest in KNOBS if getattr(args, dest) is not None}
    if "batches" in given:
        given["batches"] = _int_list("--batches", given["batches"])
    if "strategies" in given:
        given["strategies"] = tuple(s.strip() for s in given["strategies"].split(",") if s.strip())
    skip = frozenset(s.strip() for s in args.skip.split(",") if s.strip())
    options = BenchOptions(
        out=args.out, backend=args.backend, skip=skip, keep_work=args.keep_work, **given
    )
    return with_quick(options, set(given)) if args.quick else options


def run_command(args: argparse.Namespace) -> int:
    from harness.bench.driver import run_bench

    return run_bench(options_from_args(args))
