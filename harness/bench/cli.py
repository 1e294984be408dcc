"""`dcpqual bench --out FILE [--quick] [--profile] [...]`: the options, validated where they are
born, and their flags, generated from the option fields (one table, no second list).

Sizes default to the targets' geometry (16 ranks, batches 1/8/64, 100,000 modules); `--quick`
swaps in smoke sizes for those not given explicitly.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from harness.bench.targets import SECTIONS
from harness.errors import UsageError

BACKENDS = ("gloo", "nccl")
STRATEGIES = ("ag_rs", "a2a")
KIMI_HEADS = 96


def knob(default: Any, flag: str, text: str) -> Any:
    return field(default=default, metadata={"flag": flag, "help": text})


@dataclass(frozen=True)
class BenchOptions:
    """Every knob of one bench run. Invalid values never get past here."""

    out: Path
    backend: str = "gloo"
    nproc: int = knob(16, "--nproc-per-node", "ranks (default 16)")
    batches: tuple[int, ...] = knob((1, 8, 64), "--batches", "decode batch sizes (1,8,64)")
    strategies: tuple[str, ...] = knob(STRATEGIES, "--strategies", "reductions (ag_rs,a2a)")
    warmup: int = knob(5, "--warmup", "discarded iterations per case (5)")
    iters: int = knob(50, "--iters", "timed iterations per transport case (50)")
    capture_batch: int = knob(8, "--capture-batch", "batch of the capture-overhead step (8)")
    capture_iters: int = knob(200, "--capture-iters", "timed iterations of that step (200)")
    lookup_rounds: int = knob(21, "--lookup-rounds", "rounds of registry lookups (21)")
    lookup_loops: int = knob(2000, "--lookup-loops", "lookups per round (2000)")
    modules: int = knob(100_000, "--modules", "modules of the discovery model (100000)")
    discovery_repeats: int = knob(7, "--discovery-repeats", "timed discoveries (7)")
    bare_repeats: int = knob(3, "--bare-repeats", "bare torchrun launches (3)")
    suite_repeats: int = knob(1, "--suite-repeats", "full stand-in dcpqual runs (1)")
    real_nproc: int = knob(16, "--real-nproc-per-node", "ranks of the real-tree run (16)")
    timeout_s: float = knob(3600.0, "--timeout", "seconds per launch (3600)")
    skip: frozenset[str] = field(default_factory=frozenset)
    quick: bool = False
    keep_work: bool = False
    profile: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise UsageError(f"unknown --backend {self.backend!r}; expected one of {BACKENDS}")
        for name in ("nproc", "real_nproc"):
            value = getattr(self, name)
            if value < 1 or KIMI_HEADS % value:
                raise UsageError(
                    f"{_flag(name)} {value}: the Kimi-K3 geometry needs a rank count that "
                    f"divides its {KIMI_HEADS} heads"
                )
        if not self.batches or any(b < 1 for b in self.batches):
            raise UsageError(f"--batches must be positive integers, got {list(self.batches)}")
        if not self.strategies or set(self.strategies) - set(STRATEGIES):
            raise UsageError(f"--strategies must be from {STRATEGIES}, got {list(self.strategies)}")
        if self.skip - set(SECTIONS):
            raise UsageError(
                f"--skip: unknown section(s) {sorted(self.skip - set(SECTIONS))}; "
                f"sections are {SECTIONS}"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            low = 0 if f.name == "warmup" else 1
            if "flag" in f.metadata and isinstance(value, int | float) and not value >= low:
                raise UsageError(f"{_flag(f.name)} must be >= {low}, got {value}")

    def wants(self, section: str) -> bool:
        return section not in self.skip

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(out=str(self.out), skip=sorted(self.skip))
        data.update(batches=list(self.batches), strategies=list(self.strategies))
        return data


def _flag(name: str) -> str:
    return str(next(f.metadata["flag"] for f in fields(BenchOptions) if f.name == name))


# Smoke sizes: 2 ranks, few iterations, a small model. Explicit options still win.
QUICK: dict[str, Any] = {
    "nproc": 2, "real_nproc": 2, "batches": (1, 8), "warmup": 1, "iters": 5,
    "capture_iters": 20, "lookup_rounds": 5, "lookup_loops": 200, "modules": 5000,
    "discovery_repeats": 3, "bare_repeats": 1, "suite_repeats": 1,
}  # fmt: skip


def _parse(flag: str, kind: type, text: str) -> Any:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        if kind in (int, float):
            return kind(text)
        return tuple(int(p) for p in parts) if flag == "--batches" else tuple(parts)
    except ValueError:
        what = "comma-separated integers" if flag == "--batches" else "a number"
        raise UsageError(f"{flag} takes {what}, got {text!r}") from None


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bench",
        help="measure transport, launch, discovery, capture and memory costs",
        description="Measure, in one session, the harness's speed and memory targets (method "
        "and JSON in bench/README.md). Targets are reported, never asserted; exit 1 only when "
        "a section failed or a measured suite run did not pass.",
    )
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help="results JSON (new)")
    p.add_argument("--quick", action="store_true", help="smoke sizes: 2 ranks, few iterations")
    p.add_argument("--backend", default="gloo", choices=BACKENDS, help="gloo (CPU) or nccl (GPU)")
    p.add_argument("--skip", default="", metavar="SECTIONS", help=f"from {', '.join(SECTIONS)}")
    p.add_argument("--keep-work", action="store_true", help="keep rank logs and suite bundles")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also record where each full run's ranks spend their time (phase table)",
    )
    for f in fields(BenchOptions):
        if "flag" in f.metadata:
            kind = "LIST" if isinstance(f.default, tuple) else "N"
            p.add_argument(f.metadata["flag"], dest=f.name, metavar=kind, help=f.metadata["help"])
    p.set_defaults(func=run_command)


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    given = {}
    for f in fields(BenchOptions):
        text = getattr(args, f.name, None) if "flag" in f.metadata else None
        if text is not None:
            kind = type(f.default) if f.default is not MISSING else str
            given[f.name] = _parse(f.metadata["flag"], kind, text)
    skip = frozenset(s.strip() for s in args.skip.split(",") if s.strip())
    options = BenchOptions(
        out=args.out,
        backend=args.backend,
        skip=skip,
        keep_work=args.keep_work,
        profile=args.profile,
        **given,
    )
    if not args.quick:
        return options
    return replace(options, quick=True, **{k: v for k, v in QUICK.items() if k not in given})


def run_command(args: argparse.Namespace) -> int:
    from harness.bench.driver import run_bench

    return run_bench(options_from_args(args))
