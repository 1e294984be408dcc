"""`dcpqual run`: parse, validate everything up front, then hand over to the launcher pipeline.

Every check that can refuse the run happens before the out folder is created, so bad input
(exit 2, one line) never leaves a half-made bundle behind.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import UsageError
from harness.launch.plan import RunOptions

DESCRIPTION = (
    "Run the suites (or the pytest targets after --) on N ranks per node with one torchrun "
    "launch, then write and verify the evidence bundle. Exit 0 only when the verdict is pass."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="run the suites on N ranks under torchrun and write the evidence bundle",
        description=DESCRIPTION,
    )
    p.add_argument("--nproc-per-node", required=True, metavar="N", help="ranks on this node")
    p.add_argument("--nnodes", default="1", metavar="M", help="nodes in the job (default 1)")
    p.add_argument("--node-rank", default="0", metavar="K", help="this node's rank (0..M-1)")
    p.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT", help="c10d rendezvous")
    p.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (GPU)")
    p.add_argument("--out", default=None, metavar="DIR", help="evidence folder (must be new)")
    p.add_argument("--timeout", default="3600", metavar="S", help="whole run, seconds")
    p.add_argument(
        "--test-timeout", default=None, metavar="S", help="per test, seconds (default 300)"
    )
    p.add_argument("--warm-impl", default="vendored", metavar="NAME", help="warm implementation")
    p.add_argument("--tp", default="16", metavar="T", help="tensor parallel size (default 16)")
    p.add_argument("--dcp", default=None, metavar="D", help="DCP size (default min(world, 16))")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- PYTEST_ARGS...")
    p.set_defaults(func=run_command)


def _int(flag: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{flag} must be an integer, got {text!r}") from None


def _seconds(flag: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"{flag} must be a number of seconds, got {text!r}") from None


def _pytest_args(extra: list[str]) -> tuple[str, ...]:
    if extra and extra[0] == "--":
        return tuple(extra[1:])
    if extra:
        raise UsageError(f"unexpected argument {extra[0]!r}; pytest arguments go after --")
    return ()


def _check_backend_available(backend: str) -> None:
    if backend != "nccl":
        return
    import torch

    if not torch.cuda.is_available():
        raise UsageError("--backend nccl needs CUDA GPUs, and torch.cuda.is_available() is False")


def _check_warm_impl(name: str) -> None:
    try:
        from harness.warm.impls import resolve_warm_impl
    except ImportError:  # warm package not present: the ranks get the name as it is
        return
    resolve_warm_impl(name)


def _check_suites_geometry(options: RunOptions) -> None:
    """The default suites build every stand-in model at --tp: each model's heads must split.

    With explicit pytest targets the user chose what runs, and the geometry is theirs to use.
    """
    if options.pytest_args:
        return
    from harness.errors import GeometryError
    from harness.models.builders import FAMILIES
    from harness.warm.geometry import ParallelGeometry

    geometry = ParallelGeometry(tp=options.tp, dcp=options.resolved_dcp)
    for model, family in FAMILIES.items():
        try:
            geometry.local_heads(family.num_heads, model=model)
        except GeometryError as exc:
            raise GeometryError(f"{exc}; the suites build every stand-in model at --tp") from None


def options_from_args(args: argparse.Namespace) -> RunOptions:
    """Strings from argparse -> validated RunOptions (UsageError, one line, on bad input)."""
    return RunOptions(
        nproc_per_node=_int("--nproc-per-node", args.nproc_per_node),  # type: ignore[arg-type]
        nnodes=_int("--nnodes", args.nnodes),  # type: ignore[arg-type]
        node_rank=_int("--node-rank", args.node_rank),  # type: ignore[arg-type]
        rdzv_endpoint=args.rdzv_endpoint,
        backend=args.backend,
        out_dir=None if args.out is None else Path(args.out),
        timeout_s=_seconds("--timeout", args.timeout),  # type: ignore[arg-type]
        test_timeout_s=_seconds("--test-timeout", args.test_timeout),
        warm_impl=args.warm_impl,
        tp=_int("--tp", args.tp),  # type: ignore[arg-type]
        dcp=_int("--dcp", args.dcp),
        pytest_args=_pytest_args(args.pytest_args),
    )


def run_command(args: argparse.Namespace) -> int:
    from harness.launch import launcher

    options = options_from_args(args)
    _check_suites_geometry(options)
    _check_backend_available(options.backend)
    _check_warm_impl(options.warm_impl)
    return launcher.run(options)
