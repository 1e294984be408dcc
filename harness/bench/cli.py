"""`dcpqual bench --out FILE [--quick] [--profile] [...]`: the flags come from the fields of
`BenchOptions` (its descriptions are the help), which validates every value once.

Sizes default to the targets' geometry (16 ranks, batches 1/8/64, 100,000 modules); `--quick`
swaps in smoke sizes for those not given explicitly.
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from harness.errors import UsageError
from harness.schema.bench import SECTIONS, BenchOptions

# Flags whose name is not the field's; every other knob is `--field-name`.
FLAGS = {
    "nproc": "--nproc-per-node",
    "real_nproc": "--real-nproc-per-node",
    "timeout_s": "--timeout",
}
SWITCHES = ("quick", "keep_work", "profile")
# Smoke sizes: 2 ranks, few iterations, a small model. Explicit options still win.
QUICK: dict[str, Any] = dict(
    nproc=2,
    real_nproc=2,
    batches=(1, 8),
    warmup=1,
    iters=5,
    capture_iters=20,
    lookup_rounds=5,
    lookup_loops=200,
    modules=5000,
    discovery_repeats=3,
    bare_repeats=1,
    suite_repeats=1,
)


def flag(name: str) -> str:
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bench",
        help="measure transport, launch, discovery, capture and memory costs",
        description="Measure, in one session, the harness's speed and memory targets (method "
        "and JSON in bench/README.md). Targets are reported, never asserted; exit 1 only when "
        "a section failed or a measured suite run did not pass.",
    )
    p.add_argument("--out", required=True, metavar="FILE", help="results JSON (new)")
    p.add_argument("--quick", action="store_true", help="smoke sizes: 2 ranks, few iterations")
    p.add_argument("--keep-work", action="store_true", help="keep rank logs and suite bundles")
    profile = "also record where each full run's ranks spend their time (phase table)"
    p.add_argument("--profile", action="store_true", help=profile)
    p.add_argument("--skip", metavar="SECTIONS", help=f"from {', '.join(SECTIONS)}")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="gloo (CPU) or nccl (GPU)")
    for name, field in BenchOptions.model_fields.items():
        if name not in ("out", "skip", "backend", *SWITCHES):
            kind = "LIST" if isinstance(field.default, tuple) else "N"
            text = f"{field.description} ({_text(field.default)})"
            p.add_argument(flag(name), dest=name, metavar=kind, help=text)
    p.set_defaults(func=run_command)


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else f"{value:g}"


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """The options as given; a bad value is one line naming its flag (UsageError)."""
    given = {n: v for n in BenchOptions.model_fields if (v := getattr(args, n, None)) is not None}
    given.update({n: getattr(args, n) for n in SWITCHES})
    if args.quick:
        given = {**{k: v for k, v in QUICK.items() if k not in given}, **given}
    try:
        return BenchOptions.model_validate(given)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = flag(str(error["loc"][0])) if error["loc"] else "options"
        value = f" (got {error['input']!r})" if error["loc"] else ""
        raise UsageError(f"{where}: {error['msg'].removeprefix('Value error, ')}{value}") from None


def run_command(args: argparse.Namespace) -> int:
    from harness.bench.driver import run_bench

    return run_bench(options_from_args(args))
