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
        help="-- PYTEST_ARGS...: pytest arguments for every rank, as pytest takes them: options "
        "alone narrow the suites (-- -k warmup), a path or node id replaces them; checked with "
        "pytest's parser before torchrun starts (xdist, --lf/--ff, -x/--maxfail and "
        "--collect-only/--setup-only/--setup-plan are refused with what to use instead); ranks "
        "load no installed pytest plugin unless it is named here with -p NAME (e.g. -p timeout "
        "--timeout 60)",
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
        from harness.models.warm_impls import resolve_warm_impl
    except ImportError:  # warm package not present: the ranks get the name as it is
        return
    resolve_warm_impl(name)


def _check_real_trees_available(models: str) -> None:
    """Real trees and the engine lane need vLLM itself; refuse before anything is written."""
    if models == "stand-in":
        return
    from harness.core.peers import VLLM_REQUIREMENT, vllm_installed

    if not vllm_installed():
        raise UsageError(f"--models {models} needs {VLLM_REQUIREMENT}, and vllm is not importable")


def _check_real_tree_geometry(options: RunOptions) -> None:
    """vLLM 0.32 builds a real tree at tp = the world size and asserts that tp divides its
    heads (Kimi-K3's MLA and KDA: `num_heads % tp_size == 0`); only the fork pads the tail, so
    a world of 9 or 10 ranks is refused here for real trees rather than failing on every rank."""
    if options.models == "stand-in" or options.pytest_args:
        return
    from harness.errors import GeometryError
    from harness.launch.plan import REAL_MODEL_HEADS

    world = options.nproc_per_node * options.nnodes
    heads = REAL_MODEL_HEADS[options.real_model]
    if heads % world:
        raise GeometryError(
            f"vLLM 0.32's {options.real_model} cannot be built on {world} ranks (tp={world}): it "
            f"asserts that tp divides its {heads} attention heads (only the fork pads the tail); "
            "run the real trees on a world size that divides them, the stand-ins at any"
        )


def _check_suites_geometry(options: RunOptions) -> None:
    """The default suites build every stand-in model at --tp: each model's heads must split.

    With pytest targets of their own the user chose what runs, and the geometry is theirs to
    use; options alone (`-- -k warmup`) still run the suites.
    """
    if options.pytest_args and options.pytest_names_targets:
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
    rerun_of: Path | None = values.pop("rerun_of")
    names_targets = True
    if pytest_args and rerun_of is None:
        from harness.launch.plan import default_targets
        from harness.launch.pytestargs import check_pytest_args

        names_targets = check_pytest_args(pytest_args, default_targets).names_targets
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
        seed = source.hash_seeds.get(values["node_rank"])
        if "hash_seed" not in chosen.explicit and seed is not None:
            # the run's seed, drawn still where its launcher drew it: the user gave none
            values.update(hash_seed=seed.seed, hash_seed_drawn=seed.drawn)
        pytest_args = (*plugin_args(pytest_args), *source.targets)
    _warm_impl_vllm_is_the_engine_lane(values, chosen.explicit)
    spec = values.pop("nproc_per_node")
    if spec is None:
        raise UsageError("--nproc-per-node N|auto|cpu|gpu is required (or --rerun-failed BUNDLE)")
    return RunOptions(
        nproc_per_node=resolve_nproc(str(spec)),
        nproc_requested=str(spec),
        pytest_args=pytest_args,
        pytest_names_targets=names_targets,
        rerun_of=None if rerun_of is None else rerun_of.absolute(),
        **{dest: value for dest, value in values.items() if value is not None},
    )


def _warm_impl_vllm_is_the_engine_lane(values: dict[str, object], explicit: frozenset[str]) -> None:
    """`--warm-impl vllm` is a thin alias of the engine lane: vLLM's own warm is qualified by
    starting vLLM's own engine (`--models engine`), never by calling one era's private warm
    names on our stand-in trees."""
    from harness.core.choices import VLLM_WARM_IMPL

    if values.get("warm_impl") != VLLM_WARM_IMPL:
        return
    models = values.get("models")
    if "models" in explicit and models != "engine":
        raise UsageError(
            f"--warm-impl {VLLM_WARM_IMPL} is the engine lane (--models engine); "
            f"it cannot qualify --models {models}"
        )
    if "models" not in explicit:
        values["models"] = "engine"


def run_command(args: argparse.Namespace) -> int:
    from harness.launch import launcher

    options = options_from_args(args)
    from harness.image.identity import identity_from_environ

    identity_from_environ()  # the environment's inputs, before anything runs
    _check_suites_geometry(options)
    _check_real_tree_geometry(options)
    check_backend_available(options.backend, options.nproc_per_node)
    _check_warm_impl(options.warm_impl)
    from harness.launch.plan import engine_plan

    engine_plan(options)  # the engine lane's arguments and config file, refused here if bad
    _check_real_trees_available(options.models)
    return launcher.run(options)
