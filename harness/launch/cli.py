"""`dcpqual run`: parse, validate everything up front, then hand over to the launcher pipeline.

Every check that can refuse the run happens before the out folder is created, so bad input
(exit 2, one line) never leaves a half-made bundle behind.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from pathlib import Path

from harness.errors import UsageError
from harness.launch.options import (
    add_arguments,
    check_backend_available,
    choose,
    resolve_nproc,
)
from harness.launch.plan import RunOptions

DESCRIPTION = (
    "Run the suites (or the pytest targets after --) on N ranks per node with one torchrun "
    "launch, then write and verify the evidence bundle. Ends as pytest does: FAILED lines (rank "
    "and first message line, root cause first), tallies and wall time, and the command that "
    "reruns the failed tests. Exit 0 only when the verdict is pass."
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "run",
        help="run the suites on N ranks under torchrun and write the evidence bundle",
        description=DESCRIPTION,
    )
    add_arguments(p)
    p.add_argument(
        "pytest_args",
        nargs=argparse.REMAINDER,
        help="-- PYTEST_ARGS...: pytest arguments for every rank; ranks load no installed "
        "pytest plugin unless it is named here with -p NAME (e.g. -p timeout --timeout 60)",
    )
    p.set_defaults(func=run_command)


def _pytest_args(extra: list[str]) -> tuple[str, ...]:
    if extra and extra[0] == "--":
        return tuple(extra[1:])
    if extra:
        raise UsageError(f"unexpected argument {extra[0]!r}; pytest arguments go after --")
    return ()


def _check_warm_impl(name: str) -> None:
    """A built-in name needs no check (importing the warm code costs the launcher a torch
    import before torchrun starts); any other name is resolved, so a bad one is refused here."""
    from harness.core.choices import WARM_IMPL_NAMES

    if name in WARM_IMPL_NAMES:
        return
    try:
        from harness.warm.impls import resolve_warm_impl
    except ImportError:  # warm package not present: the ranks get the name as it is
        return
    resolve_warm_impl(name)


def _check_real_trees_available(models: str) -> None:
    """Real trees need vLLM's real classes; refuse before anything is written."""
    if models == "stand-in":
        return
    from harness.core.peers import VLLM_REQUIREMENT, vllm_installed

    if not vllm_installed():
        raise UsageError(f"--models {models} needs {VLLM_REQUIREMENT}, and vllm is not importable")


def _check_suites_geometry(options: RunOptions) -> None:
    """The default suites build every stand-in model at --tp: each model's heads must split.

    With explicit pytest targets the user chose what runs, and the geometry is theirs to use.
    """
    if options.pytest_args:
        return
    from harness.core.choices import FAMILY_HEADS
    from harness.core.geometry import ParallelGeometry
    from harness.errors import GeometryError

    geometry = ParallelGeometry(tp=options.tp, dcp=options.resolved_dcp)
    for model, num_heads in FAMILY_HEADS.items():
        try:
            geometry.local_heads(num_heads, model=model)
        except GeometryError as exc:
            raise GeometryError(f"{exc}; the suites build every stand-in model at --tp") from None


def options_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> RunOptions:
    """Strings from argparse (and the environment) -> validated RunOptions (UsageError, one
    line, on bad input). With --rerun-failed, what the user did not set comes from the bundle."""
    chosen = choose(args, environ)
    values = dict(chosen.values)
    pytest_args = _pytest_args(args.pytest_args)
    rerun_of: Path | None = values.pop("rerun_failed")
    if rerun_of is not None:
        from harness.launch.rerun import only_plugins, plugin_args, rerun_source

        if not only_plugins(pytest_args):
            raise UsageError(
                "--rerun-failed chooses the tests itself; give no pytest arguments but the "
                "plugins to load (-p NAME)"
            )

        source = rerun_source(rerun_of)
        for dest, value in dataclasses.asdict(source.settings).items():
            if dest not in chosen.explicit:
                values[dest] = value
        pytest_args = (*plugin_args(pytest_args), *source.targets)
    spec = values.pop("nproc_per_node")
    if spec is None:
        raise UsageError("--nproc-per-node N|auto|cpu|gpu is required (or --rerun-failed BUNDLE)")
    return RunOptions(
        nproc_per_node=resolve_nproc(str(spec)),
        nproc_requested=str(spec),
        pytest_args=pytest_args,
        rerun_of=None if rerun_of is None else rerun_of.absolute(),
        **{dest: value for dest, value in values.items() if value is not None},
    )


def run_command(args: argparse.Namespace) -> int:
    from harness.launch import launcher

    options = options_from_args(args)
    from harness.image.identity import identity_from_environ

    identity_from_environ()  # the environment's inputs, before anything runs
    _check_suites_geometry(options)
    check_backend_available(options.backend, options.nproc_per_node)
    _check_warm_impl(options.warm_impl)
    _check_real_trees_available(options.models)
    return launcher.run(options)
