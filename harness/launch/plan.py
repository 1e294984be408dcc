"""Step one of `dcpqual run`: validated options -> the exact torchrun command and environment.

Pure: nothing here starts a process or touches the disk, so every flag the ranks get is checked
by unit tests. Options are validated where they are born (`RunOptions.__post_init__`), with the
offending values in the message.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import get_args

from harness.core.signature import COMM_BACKENDS  # vLLM's --dcp-comm-backend values
from harness.errors import UsageError
from harness.launch.agent import agent_argv
from harness.launch.options import HASH_SEED_MAX, RunOptionFields
from harness.rank.preload import preload_for
from harness.schema.layout import TORCHRUN_DIR, node_dir_name
from harness.schema.plan import (
    TEST_TIMEOUT_S,
    Backend,
    ModelSource,
    RankPlan,
    RealModel,
    default_dcp,
)

BACKENDS: tuple[str, ...] = get_args(Backend)
RDZV_ID = "dcpqual"
REPO_ROOT = Path(__file__).resolve().parents[2]
_ENDPOINT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")
# Seconds torchrun's agent waits after SIGTERM before it SIGKILLs a rank. Ranks answer SIGTERM
# from their watchdog within a second; this only bounds a rank stuck holding the GIL.
SHUTDOWN_TIMEOUT_S = 10


# What one rank needs at least (torch imported, a stand-in model, gloo buffers); the bound on
# ranks per node is the machine's memory over this, so an absurd count fails before launching.
RANK_MEMORY_MIB = 256
MAX_NODES = 1024


def local_rank_capacity() -> int:
    """How many ranks this machine can hold: physical memory / RANK_MEMORY_MIB (at least 1)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 10
    return max(1, total // (RANK_MEMORY_MIB << 20))


def default_targets() -> tuple[str, ...]:
    """The suites: the checkout's suites/ folder, else the copy the installed package carries
    (`harness.core.suites`)."""
    from harness.core.suites import suites_dir

    suites = suites_dir()
    if suites is None:
        raise UsageError(
            f"no suites/ folder next to the harness at {REPO_ROOT} and none in the installed "
            "package; give the pytest targets after --"
        )
    return (str(suites),)


MODEL_SOURCES: tuple[str, ...] = get_args(ModelSource)
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8")  # vLLM's --kv-cache-dtype spellings
# The real trees `--real-model` builds (harness.models.real.configs; kept torch-free).
REAL_MODELS: tuple[str, ...] = get_args(RealModel)
# Their attention heads (the tiny configs'): vLLM 0.32 builds a real tree at tp = world size and
# asserts that tp divides them (only the fork pads the tail).
REAL_MODEL_HEADS: dict[str, int] = {"kimi-k3": 96, "deepseek-v3": 128}


@dataclass(frozen=True)
class RunOptions(RunOptionFields):
    """What the user asked `dcpqual run` for. Invalid combinations never get past here.

    The fields, their flags and defaults are `RunOptionFields`' (`harness.launch.options`), so
    a program that builds these options runs what `dcpqual run` without those flags runs."""

    def __post_init__(self) -> None:
        for flag, value, allowed in (
            ("--models", self.models, MODEL_SOURCES),
            ("--kv-cache-dtype", self.kv_cache_dtype, KV_CACHE_DTYPES),
            ("--dcp-comm-backend", self.dcp_comm_backend, COMM_BACKENDS),
            ("--real-model", self.real_model, REAL_MODELS),
            ("--draft-kv-cache-dtype", self.draft_kv_cache_dtype, ("", *KV_CACHE_DTYPES)),
            ("--engine-model", self.engine_model, ("", *REAL_MODELS)),
        ):
            if value not in allowed:
                raise UsageError(f"unknown {flag} {value!r}; expected one of {', '.join(allowed)}")
        for name in ("nproc_per_node", "nnodes", "tp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(
                    f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}"
                )
        capacity = local_rank_capacity()
        if self.nproc_per_node > capacity:
            raise UsageError(
                f"--nproc-per-node {self.nproc_per_node} is more ranks than this machine can "
                f"hold: at most {capacity} ({RANK_MEMORY_MIB} MiB of memory each)"
            )
        if self.nnodes > MAX_NODES:
            raise UsageError(f"--nnodes must be at most {MAX_NODES}, got {self.nnodes}")
        if self.dcp is not None and (isinstance(self.dcp, bool) or self.dcp < 1):
            raise UsageError(f"--dcp must be an integer >= 1, got {self.dcp!r}")
        if not 0 <= self.node_rank < self.nnodes:
            raise UsageError(
                f"--node-rank must be in 0..{self.nnodes - 1} for --nnodes {self.nnodes}, "
                f"got {self.node_rank}"
            )
        if isinstance(self.maxfail, bool) or not isinstance(self.maxfail, int) or self.maxfail < 0:
            raise UsageError(f"--maxfail must be an integer >= 0, got {self.maxfail!r}")
        outside = [r for r in self.tee if not 0 <= r < self.nproc_per_node]
        if outside:
            raise UsageError(
                f"--stream-ranks names local rank(s) {', '.join(map(str, outside))}, but this "
                f"node runs local ranks 0..{self.nproc_per_node - 1}"
            )
        if self.backend not in BACKENDS:
            raise UsageError(f"unknown --backend {self.backend!r}; expected gloo or nccl")
        if self.nnodes > 1:
            if not self.rdzv_endpoint:
                raise UsageError(f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT")
            if self.out_dir is None:
                raise UsageError(
                    "--nnodes > 1 needs an explicit --out on a folder every node can reach "
                    "(node 0 writes the bundle from all nodes' files)"
                )
        if self.rdzv_endpoint is not None:
            match = _ENDPOINT.match(self.rdzv_endpoint)
            if match is None or not 0 < int(match["port"]) < 65536:
                raise UsageError(
                    f"--rdzv-endpoint must be HOST:PORT with a port in 1..65535, "
                    f"got {self.rdzv_endpoint!r}"
                )
        for limit, seconds in (
            ("--timeout", self.timeout_s),
            ("--test-timeout", self.test_timeout_s),
        ):
            if seconds is not None and not seconds > 0:
                raise UsageError(f"{limit} must be a number of seconds > 0, got {seconds!r}")
        if self.test_timeout_s is not None and self.test_timeout_s >= self.timeout_s:
            raise UsageError(
                f"--test-timeout {self.test_timeout_s:g} must be below --timeout "
                f"{self.timeout_s:g}, or a hang is only caught by the whole run's timeout"
            )
        from harness.core.geometry import ParallelGeometry

        if self.dcp is None and self.tp % self.resolved_dcp:
            raise UsageError(
                f"world size {self.world_size} does not fit --tp {self.tp}: the default DCP "
                f"(the world size, at most 16) must divide TP; give --dcp D dividing "
                f"{self.tp} (and the world size), or --tp"
            )
        ParallelGeometry(tp=self.tp, dcp=self.resolved_dcp)
        if self.world_size % self.resolved_dcp:
            raise UsageError(
                f"world size {self.world_size} cannot be split into DCP groups of "
                f"{self.resolved_dcp} (--dcp)"
            )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def resolved_test_timeout(self) -> float:
        """`--test-timeout`, else the rank plan's default, at most half of `--timeout`."""
        if self.test_timeout_s is not None:
            return self.test_timeout_s
        return min(TEST_TIMEOUT_S, self.timeout_s / 2)

    @property
    def resolved_dcp(self) -> int:
        return self.dcp if self.dcp is not None else default_dcp(self.world_size)

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1


@dataclass(frozen=True)
class RunPlan:
    """Everything `launch` needs: argv, the environment it adds, and where files go."""

    options: RunOptions
    out_dir: Path
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    targets: tuple[str, ...] = ()

    @property
    def log_dir(self) -> Path:
        """This node's torchrun --log-dir (one per node, so two agents never collide)."""
        return self.out_dir / TORCHRUN_DIR / node_dir_name(self.options.node_rank)

    @property
    def agent_log(self) -> Path:
        return self.log_dir / "agent.log"

    @property
    def agent_error_file(self) -> Path:
        return self.log_dir / "agent-error.json"

    def child_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.update(self.env)
        return env


def torchrun_args(options: RunOptions, log_dir: Path) -> list[str]:
    """The launcher half of the command: how many ranks, how they meet, where logs go."""
    args = [sys.executable, "-m", "torch.distributed.run"]
    if options.multi_node:
        args += [
            f"--nnodes={options.nnodes}",
            f"--node-rank={options.node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={options.rdzv_endpoint}",
            f"--rdzv-id={RDZV_ID}",
        ]
    else:
        args.append("--standalone")
    args += [
        f"--nproc-per-node={options.nproc_per_node}",
        "--max-restarts=0",  # launch once: a restarted rank would hide the first failure
        "--monitor-interval=0.1",
        f"--shutdown-timeout={SHUTDOWN_TIMEOUT_S}",
        f"--log-dir={log_dir}",
        "--redirects=3",  # every rank's stdout/stderr to its own file under --log-dir
    ]
    if options.tee:
        # torchrun's own tee: the chosen ranks' lines also go to its console, prefixed with
        # their local rank; the launcher passes that console through (see launcher.launch).
        args += ["--tee=3", f"--local-ranks-filter={','.join(map(str, options.tee))}"]
    return args


# The plugins a rank loads besides pytest's own: exactly these, in this order (the output relay
# before anything writes a line; the heap's collector off before the rank plugin imports
# torch). Entry-point autoload is off on the ranks (RANK_PYTEST_ENV): the suites use no
# third-party plugin, and each one installed (anyio, xdist, hypothesis, ...) costs every rank its
# import and the assertion rewriting of its whole distribution, uncached where bytecode is not
# written. A user's own plugin is named with `-p NAME` in PYTEST_ARGS (its entry-point name
# works), or in PYTEST_PLUGINS.
RANK_PLUGINS: tuple[str, ...] = (
    "harness.rank.outrelay",
    "harness.rank.heap",
    "harness.rank.plugin",
)
RANK_PYTEST_ENV: Mapping[str, str] = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def pytest_args(targets: tuple[str, ...]) -> list[str]:
    """The rank half: pytest with the rank plugin, then the user's arguments (the plugin's
    settings travel in the rank plan)."""
    return [
        "-m",
        "pytest",
        *(arg for name in RANK_PLUGINS for arg in ("-p", name)),
        "-p",
        "no:cacheprovider",  # 16 ranks writing one .pytest_cache would race
        *targets,
    ]


# The rank plan's fields that are not an option of the same name and meaning: the launcher
# fills them (`rank_plan`), or the rank keeps the plan's default (schema, abort_grace_s).
RANK_PLAN_OWN_FIELDS: frozenset[str] = frozenset(
    {"schema_", "out_dir", "node_index", "collect_timeout_s", "abort_grace_s", "fast_exit"}
)


def rank_plan(options: RunOptions, out_dir: Path) -> RankPlan:
    """What every rank of this node runs with, serialized once into its environment: each
    option the plan also has, under the same name, then what the launcher resolves."""
    same = {f.name for f in fields(RunOptions)} - RANK_PLAN_OWN_FIELDS
    return RankPlan.model_validate(
        {
            **{name: getattr(options, name) for name in RankPlan.model_fields if name in same},
            # Options the launcher resolves replace their values as given.
            "dcp": options.resolved_dcp,
            "test_timeout_s": options.resolved_test_timeout,
            **engine_plan(options),
            "out_dir": str(out_dir),
            "node_index": options.node_rank,  # which torchrun/node-KK holds its logs
            "collect_timeout_s": options.resolved_test_timeout,  # collection is a test too
            # Records and junit are final: every rank skips its interpreter's teardown (16 of
            # them, and a thread a test left running would hold the rank). The agent reads a
            # forkserver rank's exit 0 without a return value as success, as torchrun does.
            "fast_exit": True,
        }
    )


def run_targets(options: RunOptions) -> tuple[str, ...]:
    """What the ranks' pytest is given: the user's arguments where they name targets, else the
    default targets followed by the user's options (as pytest puts its testpaths first)."""
    if options.pytest_args and options.pytest_names_targets:
        return options.pytest_args
    return (*default_targets(), *options.pytest_args)


def engine_plan(options: RunOptions) -> dict[str, object]:
    """The engine lane's part of the rank plan: its arguments checked here (UsageError), the
    config file read here, so a bad one is refused before anything is written."""
    from harness.engine.settings import parse_engine_arg, parse_engine_env, read_engine_config

    for text in options.engine_args:
        parse_engine_arg(text)
    for text in options.engine_env:
        parse_engine_env(text)
    config = {} if options.engine_config is None else read_engine_config(options.engine_config)
    return {
        "engine_model": options.engine_model or None,
        "engine_config": config,
        "engine_args": options.engine_args,
        "engine_env": options.engine_env,
    }


def build_plan(options: RunOptions, out_dir: Path) -> RunPlan:
    """The torchrun invocation for this node. `out_dir` must be absolute (ranks chdir nowhere,
    but torchrun's log paths and the ranks' files must not depend on the cwd)."""
    if not out_dir.is_absolute():
        raise ValueError(f"out_dir must be absolute, got {out_dir}")
    targets = run_targets(options)
    probe = RunPlan(options=options, out_dir=out_dir, argv=())
    argv = launch_argv(options, probe.log_dir, pytest_args(targets))
    pythonpath = os.environ.get("PYTHONPATH", "")
    env = {
        **rank_plan(options, out_dir).to_environ(),  # also: the root conftest collects suites/
        "PYTHONHASHSEED": str(resolved_hash_seed(options)),
        "TORCHELASTIC_ERROR_FILE": str(probe.agent_error_file),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), pythonpath) if p),
        "PYTHONUNBUFFERED": "1",
        **RANK_PYTEST_ENV,
    }
    return RunPlan(options=options, out_dir=out_dir, argv=argv, env=env, targets=targets)


def launch_argv(options: RunOptions, log_dir: Path, rank_argv: Sequence[str]) -> tuple[str, ...]:
    """torchrun for one local rank (nothing to share: it execs the rank's interpreter); for
    more, torchelastic's own agent with torchrun's flags, its ranks forked from a forkserver
    that imported what the run's models need once (`harness.launch.agent`)."""
    torchrun = torchrun_args(options, log_dir)
    if options.nproc_per_node == 1:
        return (*torchrun, *rank_argv)
    return agent_argv(torchrun, rank_argv, preload_for(options.models))


def resolved_hash_seed(options: RunOptions) -> int:
    """The string-hash seed every rank of this node starts with: the one asked for, else one
    drawn here. Ranks forked from the agent's forkserver can only share its seed, so a cold
    rank gets the same one, and the evidence states it (a rerun with it reproduces what hashing
    did)."""
    if options.hash_seed is not None:
        return options.hash_seed
    return secrets.randbelow(HASH_SEED_MAX) + 1  # 0 would turn randomization off
