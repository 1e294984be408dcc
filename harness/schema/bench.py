"""The bench results file (`dcpqual bench --out FILE`, schema "dcpqual-bench/v1") as pydantic
models, and the bench's options, which are both what the ranks receive and part of the file.

Times are microseconds unless a field says otherwise (`*_s` seconds, `lookup_ns`); every summary
is a median with its spread, never a mean. A section that was skipped or failed is null in
`results` and named in `missing`; its targets are `not-measured`. Method: bench/README.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from harness.schema.base import Model

SECTIONS = ("transport", "capture", "discovery", "launch", "real", "engine")
Section = Literal["transport", "capture", "discovery", "launch", "real", "engine"]
KIMI_HEADS = 96  # a bench rank count must divide Kimi-K3's heads (TP16/DCP16 geometry)


def _count(what: str, default: int, low: int = 1) -> Any:
    return Field(default, ge=low, description=what)


class BenchOptions(Model):
    """Every knob of one bench run (the `options` of the results file and the ranks' input)."""

    out: Path = Field(description="results JSON (new)")
    backend: Literal["gloo", "nccl"] = Field("gloo", description="gloo (CPU) or nccl (GPU)")
    nproc: int = _count("ranks", 16)
    batches: tuple[int, ...] = Field((1, 8, 64), min_length=1, description="decode batch sizes")
    strategies: tuple[Literal["ag_rs", "a2a"], ...] = Field(
        ("ag_rs", "a2a"), min_length=1, description="reductions"
    )
    warmup: int = _count("discarded iterations per case", 5, low=0)
    iters: int = _count("timed iterations per transport case", 50)
    capture_batch: int = _count("batch of the capture-overhead step", 8)
    capture_iters: int = _count("timed iterations of that step", 200)
    lookup_rounds: int = _count("rounds of registry lookups", 21)
    lookup_loops: int = _count("lookups per round", 2000)
    modules: int = _count("modules of the discovery model", 100_000)
    discovery_repeats: int = _count("timed discoveries", 7)
    bare_repeats: int = _count("bare torchrun launches", 3)
    suite_repeats: int = _count("full stand-in dcpqual runs", 1)
    real_nproc: int = _count("ranks of the real-tree run", 16)
    timeout_s: float = Field(3600.0, gt=0, description="seconds per launch")
    skip: tuple[Section, ...] = Field((), description="sections left out")
    quick: bool = False
    keep_work: bool = False
    profile: bool = False

    @field_validator("batches", "strategies", "skip", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return (
            [p.strip() for p in value.split(",") if p.strip()] if isinstance(value, str) else value
        )

    @field_validator("batches")
    @classmethod
    def _positive(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(b < 1 for b in value):
            raise ValueError(f"batch sizes must be positive, got {list(value)}")
        return value

    @field_validator("skip")
    @classmethod
    def _sorted(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(set(value)))

    @field_validator("nproc", "real_nproc")
    @classmethod
    def _kimi_geometry(cls, value: int) -> int:
        if KIMI_HEADS % value:
            raise ValueError(
                f"the Kimi-K3 geometry needs a rank count that divides its {KIMI_HEADS} heads"
            )
        return value

    def wants(self, section: str) -> bool:
        return section not in self.skip


class Summary(Model):
    """Median and spread of one set of samples, in the samples' unit."""

    n: int
    median: float
    p10: float
    p90: float
    q1: float
    q3: float
    min: float
    max: float
    iqr: float


class Ratio(Model):
    """numerator / denominator as a ratio of medians; `paired`: per-iteration ratios, when both
    sides ran in the same iterations (its spread says how stable the comparison is)."""

    value: float
    numerator_median: float
    denominator_median: float
    paired: Summary | None = None


class Bandwidth(Model):
    """One op's bus bandwidth at its median time (nccl-tests' busbw), and its fraction of one
    PCIe Gen5 x16 link."""

    op: str
    bus_bytes: float
    seconds: float
    busbw_gb_s: float
    pcie_gen5_x16_fraction: float


class TransportCase(Model):
    """Our transport step against the raw collectives it calls, for one (strategy, batch)."""

    strategy: str
    reduce_scatter: str
    batch: int
    world_size: int
    ours_step_us: Summary
    raw_step_us: Summary
    ratio: Ratio  # ours step / raw step
    gather_ratio: Ratio  # ours gather / raw query all-gather
    reduce_ratio: Ratio  # ours reduction / the raw reduction collectives
    ops_us: dict[str, Summary]  # "ours.gather", "raw.ag_queries", ...
    bandwidth: tuple[Bandwidth, ...]

    @property
    def label(self) -> str:
        return f"{self.strategy} B={self.batch}"


class TransportResults(Model):
    backend: str
    world_size: int
    device_name: str
    cases: tuple[TransportCase, ...]

    @property
    def worst(self) -> TransportCase:
        return max(self.cases, key=lambda c: c.ratio.value)


class CaptureOverhead(Model):
    """Eager cost of the capture machinery outside a window: each variant against `plain`."""

    strategy: str
    batch: int
    overhead_pct: float  # after_window vs plain on the eager step, in percent
    step_us: dict[str, Summary]
    lookup_ns: dict[str, Summary]  # one registry `get` hit, rank 0
    step_ratio: dict[str, Ratio]  # medians in seconds
    lookup_ratio: dict[str, Ratio]


class DiscoveryResult(Model):
    model: str
    tp: int
    dcp: int
    layers: int
    modules: int
    candidates: int
    signatures: int
    seconds: Summary
    us_per_module: Summary
    us_per_candidate: Summary


class Spread(Model):
    median: float
    max: float


class Profile(Model):
    """Where one full run's ranks spent their time: per phase the median and slowest rank."""

    ranks: int
    phases_s: dict[str, Spread]
    launcher_before_ranks_s: float  # launcher start, torchrun, python + pytest start
    ranks_s: float  # first probe loaded -> last rank done
    launcher_after_ranks_s: float  # rank exit, bundle written and verified
    cpu_s_all_ranks: float
    unprobed: tuple[str, ...]  # timer targets that no longer exist


class SuiteRuns(Model):
    """Full `dcpqual run`s against bare launches of the same size, each rank's peak RSS. For
    the real trees the bare launch's ranks also import vLLM and build the run's trees."""

    world_size: int
    backend: str
    models: str
    bare_launch_s: Summary | None
    full_suite_s: Summary
    # full / bare, medians (the target: bare is torchrun's own cold start; for the real trees,
    # cold ranks that import vLLM and build the same trees)
    ratio: Ratio | None
    # The same bare launch started as `dcpqual run` starts its ranks (torchelastic's own agent,
    # the ranks forked by multiprocessing's forkserver after its preload, `harness.launch.agent`),
    # and full / that: what the suites and the harness add beyond the launch itself.
    bare_forkserver_launch_s: Summary | None = None
    ratio_to_forkserver_launch: Ratio | None = None
    suite_exit_codes: tuple[int, ...]
    peak_rss_mb_per_rank: dict[str, float]  # rank -> max over the runs, MB (1e6 bytes)
    peak_rss_mb: float | None
    peak_rss_gib: float | None
    cpu_s_per_rank: dict[str, float]  # rank -> CPU seconds of its last run
    profile: Profile | None
    # The real run's vLLM cost over its ranks (each rank's records): importing what its rank
    # had not imported of vLLM (about nothing where the forkserver preloaded it), building the
    # trees; None for the stand-ins.
    real_import_s: Summary | None = None
    real_build_s: Summary | None = None
    real_trees: tuple[str, ...] = ()  # the configurations built (run and bare launch alike)
    # The same split over the bare real-tree launch's ranks, which import vLLM cold.
    bare_real_import_s: Summary | None = None
    bare_real_build_s: Summary | None = None
    # Seconds the real run's forkserver spent preloading (vLLM's import, once for every rank).
    forkserver_preload_s: float | None = None


class EngineRun(Model):
    """One `dcpqual run --models engine` (vLLM's own engine per rank): its wall time as the
    person waiting sees it, and per rank what its engine record already holds (the engine's
    build and eager build seconds, the rank's peak RSS), read from the bundle, not re-measured."""

    world_size: int
    backend: str
    wall_s: float
    exit_code: int
    models: tuple[str, ...]  # the model each rank's engine served
    build_s_per_rank: dict[str, float]
    eager_build_s_per_rank: dict[str, float]
    peak_rss_mib_per_rank: dict[str, float]  # MiB (2**20 bytes), as the record holds it
    peak_rss_gib: float | None  # the worst rank; None where no rank recorded an engine


class Results(Model):
    transport: TransportResults | None = None
    capture: CaptureOverhead | None = None
    discovery: DiscoveryResult | None = None
    launch: SuiteRuns | None = None
    real: SuiteRuns | None = None  # the full run on vLLM's real trees
    engine: EngineRun | None = None  # the engine lane's run


class GitSource(Model):
    commit: str
    tree: str
    dirty: bool


class NoSource(Model):
    error: str


class Environment(Model):
    host: str
    platform: str
    python: str
    torch: str
    cpu_count: int | None
    loadavg_start: tuple[float, float, float]
    loadavg_end: tuple[float, float, float] | None = None
    source: GitSource | NoSource


class TargetResult(Model):
    """One upper bound against what was measured: pass, miss (`excess`: how far over, as a
    fraction of the bound), or not-measured with the reason in `detail`."""

    key: str
    description: str
    threshold: float = Field(gt=0)
    unit: str
    outcome: Literal["pass", "miss", "not-measured"]
    measured: float | None
    excess: float | None
    detail: str

    @model_validator(mode="after")
    def _consistent(self) -> TargetResult:
        if (self.measured is None) != (self.outcome == "not-measured"):
            raise ValueError(f"target {self.key}: {self.outcome} with measured={self.measured}")
        if (self.excess is None) != (self.outcome != "miss"):
            raise ValueError(f"target {self.key}: {self.outcome} with excess={self.excess}")
        return self


class BenchReport(Model):
    """The whole results file. `complete`: every requested section measured and every suite run
    passed (the bench exits 1 otherwise)."""

    schema_: Literal["dcpqual-bench/v1"] = Field(default="dcpqual-bench/v1", alias="schema")
    created_at: str
    environment: Environment
    options: BenchOptions
    results: Results
    missing: dict[str, str]  # section -> "skipped (...)" or "failed: ..."
    targets: tuple[TargetResult, ...]
    complete: bool
    notes: tuple[str, ...] = ()


class ProbePhases(Model):
    """Wall seconds by phase on one rank (the probe plugin's `--profile` view)."""

    import_torch: float
    configure: float
    collection: float
    finish: float
    suites: dict[str, dict[str, float]]  # suite -> tests, tests_s, overhead_s, agreement_s, ...
    unprobed: tuple[str, ...]


class ProbeRecord(Model):
    """What the probe plugin writes per rank of a measured run (a scratch file outside the
    bundle): peak RSS, CPU seconds, when it loaded and ended, and the phases if profiled."""

    rank: int
    pid: int
    ru_maxrss_kib: int  # Linux: KiB
    cpu_s: float
    loaded_at: float
    ended_at: float
    phases: ProbePhases | None = None
