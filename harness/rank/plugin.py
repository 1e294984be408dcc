"""The per-rank pytest plugin ("dcpqual-rank"), loaded on every rank with `-p harness.rank.plugin`.

On each rank it: joins the process group before collection; checks over the side channel that
every rank collected the same test ids in the same order (else every rank aborts and prints the
diff, as xdist does); runs each test, then agrees with the other ranks on its outcome, so every
rank reports the same verdict and the rank whose failure came first is primary; stops the
session at the first failed test (the N-th with the plan's `maxfail`, all ranks at the same
one); runs the cases marked `subworld(size=N)` on lanes of the world side by side, each
agreed within its lane and skipped elsewhere (`harness.rank.subworld`); keeps
`records/rank-NN.json` current and writes
`junit/rank-NN.xml` through pytest's own junitxml. A watchdog thread bounds every test and turns
hangs, peer failures and SIGTERM into recorded outcomes (see `harness.rank.watchdog`).

Its settings come from one serialized `RankPlan` (`harness.schema.plan`, the `DCPQUAL_PLAN`
environment variable the launcher sets); suites reach the plan, the world and the capture hand-off
through the fixtures it provides (`rank_plan`, `world`, `record_capture`).

Rank-side only: imports only core, schema and its own package. Inert when not under torchrun.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from harness.core.suites import suites_dir
from harness.rank import outrelay
from harness.rank.agreement import Agreement, LocalResult, agree, compare_collections
from harness.rank.bootstrap import BootstrapError, RankEnv, exit_now, init_process_group, teardown
from harness.rank.fixtures import PLUGIN_NAME, rank_plan, record_capture, world
from harness.rank.parentage import parentage
from harness.rank.rankfiles import RecordKeeper, dump_stacks, junit_path, write_error_file
from harness.rank.sidechannel import SideChannel
from harness.rank.subworld import BlockState, Lane, SubworldPlan, join, plan, size_of
from harness.rank.watchdog import WatchConfig, Watchdog
from harness.rank.worldbreak import AgentWatch, destroyed_group, group_alive
from harness.schema.capture import CaptureRecord
from harness.schema.layout import RECORDS_DIR
from harness.schema.plan import RUN_TIMEOUT_S, RankPlan
from harness.schema.rank_record import (
    ELSEWHERE_SKIP,
    NO_BODY_SKIP,
    Outcome,
    RankFacts,
    RankUse,
    Selection,
    TestOutcome,
    WorldBreak,
    suite_of,
)

# The harness's own suites/ and configuration: what a run's collection is held to, wherever
# pytest's rootdir is (a folder with a suites/ of its own is not the harness's).
# The harness's own suites, whatever the rootdir: a checkout's suites/ folder, else the copy an
# installed wheel carries (`harness.core.suites`); its configuration is the checkout's
# pyproject.toml, and an installed copy has none.
HARNESS_SUITES = suites_dir() or Path(__file__).resolve().parents[2] / "suites"
HARNESS_ROOT = HARNESS_SUITES.parent
_CHECKOUT_CONFIG = HARNESS_ROOT / "pyproject.toml"
HARNESS_CONFIG = _CHECKOUT_CONFIG if _CHECKOUT_CONFIG.is_file() else None
# The collection rules of the harness's configuration (pytest's defaults, which it keeps).
COLLECTION_INI: Mapping[str, tuple[str, ...]] = {
    "python_files": ("test_*.py", "*_test.py"),
    "python_classes": ("Test",),
    "python_functions": ("test",),
}
OWN_PLUGINS = frozenset({"harness.rank.outrelay", "harness.rank.heap", "harness.rank.plugin"})

# What signal.signal returns and accepts: a Python handler, SIG_DFL/SIG_IGN, or a raw int.
SignalHandler = Callable[[int, FrameType | None], Any] | int
MAX_MESSAGE = 2000


# Fixtures the plugin provides to the suites (pytest finds them in this module's namespace).
__all__ = ["PLUGIN_NAME", "RankPlugin", "rank_plan", "record_capture", "world"]


class RankHooks:
    """Hooks the rank plugin calls, implemented where the answer is known (the repository's
    root conftest), so the rank side imports neither the transports nor the model trees."""

    @pytest.hookspec(firstresult=True)
    def pytest_dcpqual_rank_use(self) -> RankUse | None:
        """What this rank has used so far: the transports it created, the trees it built."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(RankHooks)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Runs before junitxml's configure, so the per-rank junit path is in place in time."""
    if not RankEnv.present() or config.pluginmanager.has_plugin(PLUGIN_NAME):
        return
    plugin = RankPlugin(config)
    config.pluginmanager.register(plugin, PLUGIN_NAME)
    plugin.start()


HYPOTHESIS_PLUGIN = "hypothesispytest"  # Hypothesis's pytest11 entry point


def drop_unused_hypothesis(
    pluginmanager: pytest.PytestPluginManager, modules: Mapping[str, object] = sys.modules
) -> bool:
    """Unregister Hypothesis's pytest plugin where no Hypothesis code ran in this process.

    Its terminal summary imports Hypothesis to report failing examples and observations, which
    only Hypothesis's own tests produce; where it was never imported there is nothing to report,
    and the import costs each rank about a second of CPU at the end of its session (seconds of
    a 16-rank run on a few cores). True when the plugin was dropped."""
    if "hypothesis" in modules:
        return False
    plugin = pluginmanager.get_plugin(HYPOTHESIS_PLUGIN)
    if plugin is None:
        return False
    pluginmanager.unregister(plugin)
    return True


def _short(report: pytest.TestReport | pytest.CollectReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or report.longreprtext.strip().splitlines()[-1:]
    if isinstance(text, list):
        text = text[0] if text else report.outcome
    # A message can hold what no UTF-8 encoder takes (a lone surrogate from os.fsdecode or a
    # surrogateescape decode); escaped here, it reaches peers and the receipt as the failure.
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")[:MAX_MESSAGE]


def local_outcome(reports: list[pytest.TestReport]) -> tuple[Outcome, str | None]:
    """One test's outcome on this rank from its setup/call/teardown reports: passed only when
    its call phase ran and passed (a setup that passed with no call after it ran no body)."""
    for rep in reports:
        if rep.failed:
            return ("failed" if rep.when == "call" else "error"), _short(rep)
    if any(rep.skipped for rep in reports):
        return "skipped", None
    if not any(rep.when == "call" for rep in reports):
        return "skipped", NO_BODY_SKIP
    return "passed", None


def mark_bodiless(item: pytest.Item, reports: list[pytest.TestReport]) -> None:
    """Make pytest's reports (and so junit and the terminal) call a test whose body never ran
    skipped, as its record does, not passed."""
    target = next((r for r in reports if r.when == "setup"), reports[0] if reports else None)
    if target is None:
        return
    path, line, _ = item.location
    target.outcome = "skipped"
    target.longrepr = (path, (line or 0) + 1, f"Skipped: {NO_BODY_SKIP}")


class RankPlugin:
    """Registered as "dcpqual-rank"; suites reach it through `add_capture`."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.env = RankEnv.from_env()
        self.given_plan = RankPlan.from_environ(os.environ)  # None: started by hand
        self.plan = self.given_plan or RankPlan()
        out = self.plan.out_dir
        self.out_dir = Path(out) if out else Path(tempfile.gettempdir()) / "dcpqual-rank-out"
        self.backend: str = self.plan.backend
        self.watch_config = WatchConfig(
            test_timeout_s=self.plan.test_timeout_s, abort_grace_s=self.plan.abort_grace_s
        )
        self.collect_timeout_s = self.plan.collect_timeout_s
        self.maxfail = self.plan.maxfail
        self._agreed_failures = 0
        self._deselected = 0  # collected tests -k, -m or --deselect took away
        self._by_model_source: set[str] = set()  # left out by --models, not by the user
        self._deselected_ids: set[str] = set()
        self._gathered: dict[str, Path] = {}  # every item pytest collected, before any hook
        self._skipped_files: dict[str, Path] = {}  # skipped at collection (module-level skip)
        self.keeper: RecordKeeper | None = None
        self.channel: SideChannel | None = None
        self.watchdog: Watchdog | None = None
        self.agent_watch: AgentWatch | None = None
        self._index: dict[int, int] = {}
        self.subworld = SubworldPlan()
        self._block = BlockState()
        self._root_cause: str | None = None
        self._wakeup: tuple[int, int] | None = None
        self._old_wakeup_fd = -1
        self._old_sigterm: SignalHandler | None = None
        self._session: pytest.Session | None = None
        self.fast_exit = self.plan.fast_exit
        # Without pytest's junitxml (`-p no:junitxml`) there is no option to set: the rank
        # leaves no JUnit report, and the evidence says so (its cases come from its record).
        junitxml = getattr(config.option, "xmlpath", None) is None and hasattr(
            config.option, "xmlpath"
        )
        self.writes_junit = junitxml and not hasattr(config, "workerinput")
        if self.writes_junit:
            config.option.xmlpath = str(junit_path(self.out_dir, self.env.rank))

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        env = self.env
        self.keeper = RecordKeeper.start(
            self.out_dir / RECORDS_DIR,
            rank=env.rank,
            world_size=env.world_size,
            local_rank=env.local_rank,
            node_rank=env.node_rank,
            backend=self.backend,
            device="cuda" if self.backend == "nccl" else "cpu",
            warm_impl=self.plan.warm_impl,
            output_relay=outrelay.relay_pid(),
            plan=self.given_plan,
        )
        test_timeout = self.watch_config.test_timeout_s
        pg_timeout = timedelta(seconds=(test_timeout if test_timeout > 0 else 1800.0) + 60.0)
        try:
            device = init_process_group(self.backend, env, pg_timeout)
        except BootstrapError as exc:
            self.keeper.finish(abort_reason=f"bootstrap failed: {exc}", primary=True)
            write_error_file(env.rank, None, f"bootstrap failed: {exc}")
            raise pytest.UsageError(f"dcpqual rank {env.rank}: {exc}") from None
        self.keeper.update(device=str(device), extra=self._where(), **self._degrees())
        keeper = self.keeper
        above = parentage()
        self.agent_watch = AgentWatch(
            env.rank,
            above.agent,
            lambda: keeper.record.current_test,
            self._broke_world,
            between=above.between(),
        ).install()
        self.channel = SideChannel.for_process_group(env.rank, env.world_size)
        self.watchdog = Watchdog(
            rank=env.rank,
            world_size=env.world_size,
            channel=self.channel.clone(),
            keeper=self.keeper,
            out_dir=self.out_dir,
            config=self.watch_config,
            wakeup_fd=self._install_sigterm(),
        )
        self.watchdog.start()

    def _broke_world(self, broke: WorldBreak) -> None:
        """Record this rank's own world-breaking action at once (the first one only): the
        evidence makes it the root cause even if this rank never reports again."""
        if self.keeper is not None and self.keeper.record.broke_world is None:
            self.keeper.update(broke_world=broke)
            sys.stderr.write(f"\ndcpqual rank {self.env.rank}: {broke.message}\n")

    def _degrees(self) -> dict[str, int]:
        """The tp and dcp the suites on this rank qualify (the `qualification` fixture's)."""
        return {"tp": self.plan.tp, "dcp": self.plan.resolved_dcp(self.env.world_size)}

    def _selection(self, items: list[pytest.Item]) -> Selection:
        """What pytest was told to select here, and what it collected against the harness's
        own suites/, for the evidence to name any narrowing, by whatever means."""
        config = self.config
        ignored = [*(config.getoption("ignore") or []), *(config.getoption("ignore_glob") or [])]
        kept = {item.nodeid for item in items}
        removed = set(self._gathered) - kept - self._deselected_ids
        return Selection.of(
            [str(a) for a in config.args],
            invocation_dir=config.invocation_params.dir,
            suites=HARNESS_SUITES,
            deselected=self._deselected,
            ignored=[str(p) for p in ignored],
            **self._against_suites(),
            removed=len(removed),
            rules=self._foreign_rules(),
        )

    def _against_suites(self) -> dict[str, list[str]]:
        """The harness's suites files that gave no test (neither collected nor skipped at
        collection), and the files tests were collected from outside them."""
        seen: dict[Path, str] = {}
        for nodeid, path in [*self._gathered.items(), *self._skipped_files.items()]:
            seen.setdefault(path, nodeid.split("::", 1)[0])
        suites = HARNESS_SUITES.resolve()
        expected = {
            path.resolve()
            for pattern in COLLECTION_INI["python_files"]
            for path in suites.rglob(pattern)
        }
        return {
            "unreached": sorted(str(p.relative_to(HARNESS_ROOT)) for p in expected - set(seen)),
            "outside": sorted({f for p, f in seen.items() if not p.is_relative_to(suites)}),
        }

    def _foreign_rules(self) -> list[str]:
        """Collection rules that are not the harness's: any one of them can narrow a run
        (ini overrides, another configuration file, a conftest or a plugin from elsewhere)."""
        config = self.config
        rules = []
        for name, harness in COLLECTION_INI.items():
            value = tuple(str(v) for v in config.getini(name))
            if value != harness:
                rules.append(f"{name} is {' '.join(value)!r}, not {' '.join(harness)!r}")
        inipath = config.inipath
        if (inipath.resolve() if inipath is not None else None) != HARNESS_CONFIG:
            rules.append(
                f"configuration from {inipath or 'no file'}, not {HARNESS_CONFIG or 'none'}"
            )
        for plugin in config.pluginmanager.get_plugins():
            file = getattr(plugin, "__file__", None)
            if not isinstance(file, str) or Path(file).name != "conftest.py":
                continue
            if not Path(file).resolve().is_relative_to(HARNESS_ROOT):
                rules.append(f"a conftest.py from outside the harness: {file}")
        for name in getattr(config.option, "plugins", None) or []:
            if not name.startswith("no:") and name not in OWN_PLUGINS:
                rules.append(f"a plugin given with -p: {name}")
        if os.environ.get("PYTEST_PLUGINS"):
            rules.append(f"plugins given in PYTEST_PLUGINS: {os.environ['PYTEST_PLUGINS']}")
        return rules

    def left_out_by_model_source(self, items: list[pytest.Item]) -> None:
        """The suites leave these out because of the run's --models (the receipt's real-trees
        limitation names that); called before they are deselected, so they are not counted as
        a narrowed selection."""
        self._by_model_source.update(item.nodeid for item in items)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self._deselected += sum(1 for item in items if item.nodeid not in self._by_model_source)
        self._deselected_ids.update(item.nodeid for item in items)

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        """Every item as pytest collects it, before any hook takes one away."""
        self._gathered[item.nodeid] = Path(item.path).resolve()

    def _where(self) -> RankFacts:
        """Where this rank's files and tests live: the pytest rootdir its node ids are relative
        to (a rerun makes them absolute), the launcher's node index, whose torchrun/node-KK
        folder holds its logs, and whether pytest's junitxml writes its report."""
        facts = self.keeper.record.extra if self.keeper else RankFacts()
        return replace(
            facts,
            rootdir=str(self.config.rootpath),
            node_index=self.plan.node_index,
            junit=self.writes_junit,
        )

    def _install_sigterm(self) -> int | None:
        """Route SIGTERM to the watchdog through a wakeup pipe (works while main is in C++)."""
        try:
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            os.set_blocking(write_fd, False)
            self._old_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._old_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):  # not the main thread: rely on torchrun's SIGKILL
            return None
        self._wakeup = (read_fd, write_fd)
        return read_fd

    def _on_sigterm(self, signum: int, frame: object) -> None:
        if self.watchdog is None or not self.watchdog.is_alive():
            os._exit(128 + signum)
        # else: the watchdog got the same signal through the wakeup pipe and handles it

    def _note_transports(self) -> None:
        """Keep `extra.transports` and `extra.real_trees` current after every test, so even a
        rank that stops at a failure (and never finishes its session) says which transports it
        created. The code that made them answers `pytest_dcpqual_rank_use`."""
        if self.keeper is None:
            return
        used = self.config.hook.pytest_dcpqual_rank_use()
        if used is None:
            return
        facts = self.keeper.record.extra
        now = (used.transports, used.real_trees, used.engine)
        if (facts.transports, facts.real_trees, facts.engine) != now:
            changed = replace(
                facts, transports=used.transports, real_trees=used.real_trees, engine=used.engine
            )
            self.keeper.note(extra=changed)  # written by the caller's next write

    def add_capture(self, record: CaptureRecord) -> None:
        """Hand a capture window's record to this rank's record (suites' `record_capture`)."""
        if self.keeper is not None:
            self.keeper.add_capture(record)

    # -- collection -------------------------------------------------------------------------

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped and self.keeper is not None:
            self._skipped_at_collection(report)
        if report.failed and self.keeper is not None:
            message = _short(report)
            self.keeper.add_test(
                TestOutcome(
                    nodeid=report.nodeid or "<collection>",
                    outcome="error",
                    message=f"collection error: {message}",
                    failed_at=time.time(),
                )
            )
            write_error_file(self.env.rank, report.nodeid, f"collection error: {message}")

    def _skipped_at_collection(self, report: pytest.CollectReport) -> None:
        """A module skipped as it was collected (`pytest.skip(allow_module_level=True)`,
        `importorskip`): its tests never ran, so it is a skipped test of the record."""
        assert self.keeper is not None
        nodeid = report.nodeid or "<collection>"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else _short(report)
        self._skipped_files[nodeid] = (self.config.rootpath / nodeid.split("::", 1)[0]).resolve()
        self.keeper.add_test(
            TestOutcome(
                nodeid=nodeid, outcome="skipped", message=f"skipped at collection: {reason}"
            )
        )

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Place sub-world cases on lanes of the world (`harness.rank.subworld`); the order
        this gives is the same on every rank and is checked like any collection."""
        cases = [(suite_of(item.nodeid), size_of(item)) for item in items]
        order, self.subworld = plan(cases, self.env.world_size)
        items[:] = [items[i] for i in order]
        if self.subworld.lanes and self.keeper is not None:
            blocks = self.subworld.record_blocks()
            self.keeper.update(extra=replace(self.keeper.record.extra, subworld=blocks))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        assert self.keeper is not None and self.channel is not None
        nodeids = tuple(item.nodeid for item in session.items)
        self._index = {id(item): i for i, item in enumerate(session.items)}
        self.keeper.collected(nodeids)
        self.keeper.update(selection=self._selection(session.items))
        self.channel.post_collection(nodeids)
        lists = self.channel.gather_collections(time.monotonic() + self.collect_timeout_s)
        missing = [r for r in range(self.env.world_size) if r not in lists]
        if missing:
            reason = (
                f"rank(s) {', '.join(map(str, missing))} never finished collection within "
                f"{self.collect_timeout_s:g}s"
            )
            # Structured, so the evidence blames the rank that hung, not this one.
            self.keeper.update(
                extra=replace(self.keeper.record.extra, missing_collection=tuple(missing))
            )
            self._abort_collection(reason, primary=False)
        mismatch = compare_collections(lists)
        if mismatch is not None:
            primary = self.env.rank in mismatch.odd_ranks
            self._abort_collection(mismatch.describe(), primary=primary)

    def _abort_collection(self, reason: str, *, primary: bool) -> None:
        assert self.keeper is not None and self.channel is not None
        sys.stderr.write(f"\ndcpqual rank {self.env.rank}: {reason}\n")
        first_line = reason.splitlines()[0]
        self.keeper.finish(abort_reason=first_line, primary=primary)
        if primary:
            write_error_file(self.env.rank, None, first_line, reason)
        self.channel.signal_abort(f"rank {self.env.rank}: {first_line}")
        pytest.exit(f"dcpqual: {first_line}", returncode=pytest.ExitCode.INTERRUPTED)

    # -- tests ------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool:
        index = self._index.get(id(item), -1)
        lane = self.subworld.lane_of(index)
        if lane is not None and self.env.rank not in lane.ranks:
            self._run_elsewhere(item, nextitem, lane)
        elif lane is None or not self._block.lane_stopped(self._agreed_failures, self.maxfail):
            self._run_here(item, nextitem, index, lane)
        block = self.subworld.block_ending_at(index)
        if block is not None:
            self._join_block(item, block)
        return True

    def _run_elsewhere(self, item: pytest.Item, nextitem: pytest.Item | None, lane: Lane) -> None:
        """A sub-world case of another lane: a skip here, naming the ranks that run it."""
        from _pytest.runner import runtestprotocol

        assert self.keeper is not None
        reason = f"{ELSEWHERE_SKIP}{lane.describe()}, not on rank {self.env.rank}"
        item.add_marker(pytest.mark.skip(reason=reason))
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        self.keeper.add_test(
            TestOutcome(nodeid=item.nodeid, outcome="skipped", message=reason, elsewhere=True)
        )
        for rep in reports:
            item.ihook.pytest_runtest_logreport(report=rep)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)

    def _join_block(self, item: pytest.Item, block: int) -> None:
        """After a block of sub-world cases: every rank learns every lane's failures and the
        whole world stops here, or goes on, together."""
        assert self.channel is not None and self.keeper is not None
        test_timeout = self.watch_config.test_timeout_s
        timeout = test_timeout if test_timeout > 0 else RUN_TIMEOUT_S  # none: the run's default
        wait_s = (timeout + 15.0) * self.subworld.block_size(block)
        self.keeper.waiting()
        joined = join(self.channel, block, self._block, self.env.world_size, wait_s=wait_s)
        stop = joined.stop(self._agreed_failures, self.maxfail)
        self._agreed_failures += len(joined.failed)
        self._block = BlockState()
        if stop:
            why = f"{len(joined.failed)} failed sub-world case(s)"
            if joined.missing:
                why += f"; rank(s) {list(joined.missing)} never joined"
            item.session.shouldfail = f"dcpqual: stopping after {why}"

    def _run_here(
        self, item: pytest.Item, nextitem: pytest.Item | None, index: int, lane: Lane | None
    ) -> None:
        from _pytest.runner import runtestprotocol

        assert self.keeper is not None and self.channel is not None and self.watchdog is not None
        ranks = None if lane is None else lane.ranks
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        self.keeper.running(item.nodeid)
        self.watchdog.begin_test(index, item.nodeid, ranks)
        started = time.monotonic()
        alive_before = group_alive()
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        duration = time.monotonic() - started
        if not self.watchdog.body_done():
            self.watchdog.park()
        outcome, message = local_outcome(reports)
        broke = destroyed_group(self.env.rank, item.nodeid, alive_before=alive_before)
        if broke is not None:
            self._broke_world(broke)
            outcome, message = "failed", broke.message
        failing = outcome in ("failed", "error")
        mine = LocalResult(
            rank=self.env.rank,
            outcome=outcome,
            message=message,
            duration_s=duration,
            failed_at=time.time() if failing else None,
            fail_seq=self.channel.next_fail_seq(index) if failing else None,
            broke_world=broke is not None,
        )
        self.channel.post_result(index, mine)
        self.keeper.waiting()
        results = self.channel.gather_results(index, self.watchdog.test_deadline(), ranks)
        results[self.env.rank] = mine
        agreement = agree(item.nodeid, results, self.env.world_size, ranks)
        self.watchdog.idle()
        if any(r.kind == "timeout" for r in results.values()):
            dump_stacks(self.out_dir, self.env.rank, f"a peer timed out in {item.nodeid}")
        recorded = agreement.outcome_for(mine)
        if message == NO_BODY_SKIP:
            mark_bodiless(item, reports)
            if recorded.outcome == "skipped":
                recorded = replace(recorded, no_body=True)
        self._note_transports()
        self.keeper.add_test(recorded)
        self._apply(reports, agreement.failed, recorded)
        for rep in reports:
            item.ihook.pytest_runtest_logreport(report=rep)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        if agreement.failed:
            self._root_cause = f"{agreement.describe()} [{item.nodeid}]"
            if recorded.primary:
                text = next((r.longreprtext for r in reports if r.failed), message or "")
                write_error_file(self.env.rank, item.nodeid, message or "failed", text)
            if lane is not None:  # decided with the other lanes after the block
                hard = not agreement.complete or any(r.kind != "ran" for r in results.values())
                self._block.note_failure(index, hard=hard)
            elif self._stop_after(agreement, results):
                item.session.shouldfail = f"dcpqual: stopping after {agreement.describe()}"

    def _stop_after(self, agreement: Agreement, results: dict[int, LocalResult]) -> bool:
        """Stop at this failed test? Decided only from what every rank agreed on, so all ranks
        stop (or go on) at the same test: an incomplete agreement, or any rank that timed out
        or was aborted (it is gone or out of step), always stops; else the plan's `maxfail`."""
        self._agreed_failures += 1
        if not agreement.complete or any(r.kind != "ran" for r in results.values()):
            return True
        return self.maxfail > 0 and self._agreed_failures >= self.maxfail

    @staticmethod
    def _apply(reports: list[pytest.TestReport], failed: bool, recorded: TestOutcome) -> None:
        """Make pytest's reports (and so junit) tell the agreed verdict on this rank too."""
        if not failed:
            return
        local_failed = [r for r in reports if r.failed]
        if local_failed:
            if not recorded.primary:
                ranks = ", ".join(map(str, recorded.failing_ranks))
                for rep in local_failed:
                    rep.sections.append(
                        ("dcpqual", f"secondary failure: rank(s) {ranks} failed this test first")
                    )
            return
        target = next((r for r in reports if r.when == "call"), reports[-1])
        target.outcome = "failed"
        target.longrepr = f"[dcpqual] {recorded.message}"
        if hasattr(target, "wasxfail"):
            del target.wasxfail

    # -- end --------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self._session = session
        if self.watchdog is not None:
            self.watchdog.session_finishing()
        drop_unused_hypothesis(self.config.pluginmanager)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """After junitxml wrote its file: the record becomes complete, then leave the group."""
        if self.keeper is not None:
            self._note_transports()
            self.keeper.finish()
        if self.watchdog is not None:
            self.watchdog.session_finished()
        if self.agent_watch is not None:
            self.agent_watch.close()
        try:
            teardown()
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()
            self._restore_sigterm()
        if self.fast_exit and self._session is not None:
            exit_now(int(self._session.exitstatus))  # records and junit are final

    def _restore_sigterm(self) -> None:
        if self._wakeup is None:
            return
        signal.set_wakeup_fd(self._old_wakeup_fd)
        if self._old_sigterm is not None:  # None: installed from C, cannot be restored
            signal.signal(signal.SIGTERM, self._old_sigterm)
        for fd in self._wakeup:
            os.close(fd)
        self._wakeup = None

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self._root_cause:
            terminalreporter.write_sep("=", "dcpqual")
            terminalreporter.write_line(f"root cause: {self._root_cause}")
