"""torchelastic's own agent in torchrun's place (`harness.launch.agent`): its ranks, forked by
multiprocessing's forkserver, are what torchrun's cold ranks are to a suite; it ends as torchrun
ends (its failure report, the rank's exit code or signal); nothing it started outlives it.

Each launch goes through the launcher, which fails a launch that leaves a process behind."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from _support import forkserver

from harness.bench.launching import dead_ranks
from harness.errors import UsageError
from harness.launch.agent import (
    STARTED_COLD,
    agent_argv,
    local_ranks,
    signals_to_handle,
    split_argv,
)
from harness.launch.launcher import launch
from harness.launch.plan import REPO_ROOT, RunOptions, RunPlan, torchrun_args
from harness.launch.ranklogs import torchrun_logs
from harness.rank import parentage
from harness.schema.launch import Launch

pytestmark = pytest.mark.torchrun

# What a suite could observe of how its interpreter started, and the draws every interpreter
# makes for itself; written per rank, then the ranks may end as `sys.argv[1]` says.
PROBE = """
import json, multiprocessing, os, random, signal, sys, time
from multiprocessing import forkserver, resource_tracker
import torch, torch.distributed as dist
import warnmod
from harness.rank import parentage
def _parent_death_signal():
    import ctypes
    sig = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
    return sig.value
dist.init_process_group("gloo")
rank, me = dist.get_rank(), multiprocessing.current_process()
facts = {
    "argv": sys.argv[1:],
    "argv0": os.path.basename(sys.argv[0]),
    "main": [__name__, sys.modules["__main__"].__dict__.get("__file__") == __file__],
    "orig_argv": sys.orig_argv[1:],
    "path0": sys.path[0],
    "process": [me.name, list(me._identity), multiprocessing.parent_process() is None],
    "session_leader": os.getsid(0) == os.getpid(),
    "signals": [signal.getsignal(signal.SIGINT) is signal.default_int_handler,
                signal.getsignal(signal.SIGTERM) == signal.SIG_DFL],
    "threads": torch.get_num_threads(),
    "mp_helpers": [forkserver._forkserver._forkserver_alive_fd,
                   resource_tracker._resource_tracker._fd],
    "mp_start_lock_free": forkserver._forkserver._lock.acquire(timeout=2),
    "agent": open(f"/proc/{parentage.agent_pid()}/cmdline").read().split(chr(0))[1:3],
    "hash": hash("dcpqual"),
    "start_method": multiprocessing.get_start_method(allow_none=True),
    "mp_tempdir": me._config.get("tempdir"),
    "stdin": [sys.stdin is sys.__stdin__, sys.stdin.closed, sys.stdin.fileno(), repr(sys.stdin),
              sys.stdin.newlines, repr(sys.stdin.buffer.raw)],
    "elastic_env": os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE"),
    "parent_death_signal": _parent_death_signal(),
    "drawn": [me.authkey.hex(), random.random(), torch.initial_seed()],
}
with open(os.path.join(os.environ["PROBE_FACTS"], f"rank-{rank}.json"), "w") as f:
    json.dump(facts, f)
if sys.argv[1] == "helper-left":  # rank 0 sleeps; rank 1 fails once rank 0's helper runs
    helper_pid = os.path.join(os.environ["PROBE_FACTS"], "helper.pid")
    if rank == 0:
        import subprocess
        with open(helper_pid + ".tmp", "w") as f:
            f.write(str(subprocess.Popen(["sleep", "600"]).pid))
        os.rename(helper_pid + ".tmp", helper_pid)
        time.sleep(600)
    while not os.path.exists(helper_pid):
        time.sleep(0.05)
    os._exit(3)
if sys.argv[1] == "daemon-left" and rank == 0:  # a daemon of its own session outlives the rank
    daemon_pid = os.path.join(os.environ["PROBE_FACTS"], "daemon.pid")
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(daemon_pid + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(daemon_pid + ".tmp", daemon_pid)
            time.sleep(600)
        os._exit(0)
    os.wait()
    while not os.path.exists(daemon_pid):
        time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
if rank == 1 and sys.argv[1] == "exit-3":
    sys.exit(3)
if rank == 1 and sys.argv[1] == "interrupt":
    raise KeyboardInterrupt
if rank == 1 and sys.argv[1] == "os-exit-0":  # skips the interpreter's teardown, as some do
    os._exit(0)
"""
# Preloaded with torch by the agent's forkserver: one that warns as it is imported, one whose
# import fails (a module built against another torch).
WARNMOD = 'import warnings\nwarnings.warn("warnmod was imported", UserWarning)\n'
BROKENMOD = 'raise ImportError("brokenmod was built against another torch")\n'
PRELOAD = ("torch", "torch.distributed", "warnmod", "brokenmod")
# A preload that leaves a thread running in the forkserver: it may fork no rank.
THREADMOD = (
    "import threading\nthreading.Thread(target=threading.Event().wait, daemon=True).start()\n"
)
SAME_IN_BOTH = (
    "argv",
    "argv0",
    "main",
    "orig_argv",
    "path0",
    "process",
    "session_leader",
    "signals",
    "threads",
    "mp_helpers",
    "mp_start_lock_free",  # a rank may start a forkserver of its own
    "hash",
    "start_method",
    "mp_tempdir",
    "stdin",
    "elastic_env",
    "parent_death_signal",
)


def _launch(
    tmp_path: Path,
    name: str,
    *,
    forkserver: bool,
    ending: str = "pass",
    timeout_s: float = 120,
    preload: tuple[str, ...] = PRELOAD,
) -> Launch:
    """Two ranks running the probe, cold under torchrun or through the agent."""
    modules = {"agentprobe": PROBE, "warnmod": WARNMOD, "brokenmod": BROKENMOD}
    for module, text in {**modules, "threadmod": THREADMOD}.items():
        (tmp_path / f"{module}.py").write_text(text)
    facts = tmp_path / f"{name}-facts"
    facts.mkdir()
    options = RunOptions(nproc_per_node=2, tp=2, dcp=2, timeout_s=timeout_s)
    out = tmp_path / name
    torchrun = torchrun_args(options, RunPlan(options, out, ()).log_dir)
    rank = ("-m", "agentprobe", ending)
    argv = agent_argv(torchrun, rank, preload) if forkserver else ()
    path = f"{tmp_path}:{REPO_ROOT}"
    env = {"PYTHONPATH": path, "PYTHONHASHSEED": "7", "PYTHONUNBUFFERED": "1"}
    env["PROBE_FACTS"] = str(facts)
    plan = RunPlan(options, out, argv or (*torchrun, *rank), env=env)
    return launch(plan, tick_s=0.2)


def _facts(tmp_path: Path, name: str) -> list[dict[str, object]]:
    folder = tmp_path / f"{name}-facts"
    return [json.loads((folder / f"rank-{r}.json").read_text()) for r in (0, 1)]


# The probe's three launches that should pass: cold, through the agent, and through an agent
# whose preload left a thread alive. Rank 1 ends each by `os._exit(0)`, as some ranks do.
STARTS = {
    "cold": (False, PRELOAD),
    "forkserver": (True, PRELOAD),
    "refused": (True, (*PRELOAD, "threadmod")),
}


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Launch]]:
    folder = tmp_path_factory.mktemp("starts")
    results = {
        name: _launch(
            folder, name, forkserver=forked, ending="os-exit-0", preload=preload, timeout_s=60
        )
        for name, (forked, preload) in STARTS.items()
    }
    return folder, results


@pytest.fixture(scope="module")
def both_starts(launches: tuple[Path, dict[str, Launch]]) -> Path:
    """The folder of `launches`, each of which passed and left nothing running."""
    folder, results = launches
    for result in results.values():
        assert result.exit_code == 0 and not result.leftovers, result
    return folder


def test_a_forkserver_rank_looks_to_a_suite_as_a_cold_rank_does(both_starts: Path) -> None:
    cold, forked = _facts(both_starts, "cold"), _facts(both_starts, "forkserver")
    for rank in (0, 1):
        for key in SAME_IN_BOTH:
            assert forked[rank][key] == cold[rank][key], (rank, key)
    assert cold[0]["process"] == ["MainProcess", [], True]
    # Each knows the agent that started it (`harness.rank.parentage`), its parent or not.
    assert [r["agent"] for r in cold] == [["-m", "torch.distributed.run"]] * 2
    assert [r["agent"] for r in forked] == [["-m", "harness.launch.agent"]] * 2
    assert cold[0]["main"] == ["__main__", True] and cold[0]["session_leader"] is True


def test_a_forkserver_that_may_not_fork_leaves_the_ranks_to_torchrun_cold(
    both_starts: Path,
) -> None:
    """A thread the preload left alive in the server: the agent says why on its log and
    becomes torchrun with the same flags, whose ranks are cold ones in every respect."""
    cold, refused = _facts(both_starts, "cold"), _facts(both_starts, "refused")
    for rank in (0, 1):
        for key in (*SAME_IN_BOTH, "agent"):
            assert refused[rank][key] == cold[rank][key], (rank, key)
    log = RunPlan(RunOptions(nproc_per_node=2, tp=2, dcp=2), both_starts / "refused", ())
    said = [line for line in log.agent_log.read_text().splitlines() if STARTED_COLD in line]
    assert said and "2 threads alive in the forkserver" in said[0], said


def test_what_the_preload_warned_is_on_each_ranks_stderr_as_on_a_cold_ones(
    both_starts: Path,
) -> None:
    def warned(name: str) -> dict[int, list[str]]:
        return {
            log.local_rank: [
                line for line in log.path.read_text().splitlines() if "warnmod" in line
            ]
            for log in torchrun_logs(both_starts / name)
            if log.stream == "stderr"
        }

    cold = warned("cold")
    assert cold == warned("forkserver")
    assert all(
        len(lines) == 2 and "UserWarning: warnmod was imported" in lines[0]
        for lines in cold.values()
    )


def test_a_module_whose_preload_failed_is_named_on_the_agents_log(both_starts: Path) -> None:
    """Left out of the preload (each rank imports it, and fails, as a cold one would)."""
    log = RunPlan(RunOptions(nproc_per_node=2, tp=2, dcp=2), both_starts / "forkserver", ())
    assert (
        "dcpqual forkserver: not preloaded: brokenmod: ImportError: brokenmod was built against "
        "another torch"
    ) in log.agent_log.read_text().splitlines()


def test_each_forkserver_rank_draws_its_own_seeds_and_authkey(both_starts: Path) -> None:
    drawn = [r["drawn"] for r in _facts(both_starts, "forkserver")]
    for position in range(3):  # authkey, random, torch's seed
        assert drawn[0][position] != drawn[1][position], position


def test_the_agent_leaves_its_logs_where_torchrun_does(both_starts: Path) -> None:
    for name in ("cold", "forkserver"):
        logs = {(log.local_rank, log.stream) for log in torchrun_logs(both_starts / name)}
        assert logs == {(r, s) for r in (0, 1) for s in ("stdout", "stderr")}, name


def test_a_forkserver_child_left_as_it_is_is_no_cold_interpreter() -> None:
    """The control: what the parity test would see without the rank becoming cold."""
    with forkserver.context().Pool(1) as pool:
        name = pool.apply(_process_name)
    assert name != "MainProcess"


def _process_name() -> str:
    return multiprocessing.current_process().name


@pytest.mark.parametrize(
    ("ending", "code"), [("exit-3", 3), ("interrupt", -2)], ids=["exit-3", "sigint"]
)
def test_a_failing_rank_fails_the_agent_as_it_fails_torchrun(
    tmp_path: Path, ending: str, code: int
) -> None:
    result = _launch(tmp_path, "fail", forkserver=True, ending=ending)
    assert result.exit_code == 1 and not result.leftovers, result
    agent_log = RunPlan(RunOptions(nproc_per_node=2, tp=2, dcp=2), tmp_path / "fail", ()).agent_log
    assert dead_ranks(agent_log.read_text()) == [(1, 1, code)]


def test_a_rank_that_ends_by_os_exit_0_succeeds_as_under_torchrun(
    launches: tuple[Path, dict[str, Launch]],
) -> None:
    """Rank 1 of each of `launches` hands torchelastic no return value: the agent reads its
    exit 0 as torchrun would, instead of waiting for a value (and its peers for the agent)
    until the launch's timeout."""
    _, results = launches
    ended = {name: (r.exit_code, r.timed_out, r.leftovers) for name, r in results.items()}
    assert ended == dict.fromkeys(STARTS, (0, False, [])), results


def test_the_agent_ends_a_ranks_helpers_with_it_as_torchrun_does(tmp_path: Path) -> None:
    """torchrun signals a rank's whole session; so does the agent, so a helper the rank
    started is ended with it, not left for the launcher to find."""
    result = _launch(tmp_path, "helper", forkserver=True, ending="helper-left")
    helper = int((tmp_path / "helper-facts" / "helper.pid").read_text())
    assert result.exit_code == 1 and result.leftovers == [], result
    assert not psutil.pid_exists(helper) or psutil.Process(helper).status() == "zombie"


def test_a_daemon_a_rank_left_is_the_launchers_to_end_not_a_hang_of_the_agent(
    tmp_path: Path,
) -> None:
    """A rank's daemon (its own session, so no signal to the rank reaches it) outlives the
    ranks; the agent still ends, and the launcher finds the daemon, as it finds a cold rank's.
    A daemon that held the agent's forkserver or resource tracker open would hang the agent,
    which waits for both as it ends, until the launch's timeout."""
    result = _launch(tmp_path, "daemon", forkserver=True, ending="daemon-left", timeout_s=40)
    daemon = int((tmp_path / "daemon-facts" / "daemon.pid").read_text())
    assert not result.timed_out and result.exit_code == 0, result
    assert result.leftovers == [daemon]


def test_a_forkserver_ranks_agent_is_not_its_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the rank's watchdog and world-break watch read: the agent, and the forkserver
    between it and the rank; such a rank was forked (it shares the server's string-hash seed,
    which the evidence states)."""
    monkeypatch.setattr(parentage, "_forked", None)
    assert not parentage.parentage().forked and parentage.parentage().between() == {}
    parentage.set_forked(parentage.Parentage(agent=33, forkserver=44))
    assert parentage.agent_pid() == 33 and parentage.parentage().forked
    assert parentage.parentage().between() == {44: "the forkserver that forked it (its agent's)"}


def test_the_agents_own_arguments_are_read_before_torchruns() -> None:
    assert split_argv(["--preload", "torch,pytest", "--", "--standalone", "-m", "x"]) == (
        ("torch", "pytest"),
        ("--standalone", "-m", "x"),
    )
    assert split_argv(["--", "-m", "x"]) == ((), ("-m", "x"))
    for bad in (["--preload"], ["--standalone", "-m", "x"]):
        with pytest.raises(UsageError):
            split_argv(bad)
    assert local_ranks(["--nproc-per-node=16"]) == local_ranks(["--nproc_per_node", "16"]) == 16
    assert local_ranks(["--nproc-per-node", "gpu"]) is None and local_ranks(["-m", "x"]) is None


def test_the_signals_torchelastic_puts_in_a_ranks_environment_are_torchruns() -> None:
    """The agent puts them in its environment as it launches, after the forkserver started:
    the server has them from its start, as a cold rank inherits them."""
    from torch.distributed.launcher.api import LaunchConfig
    from torch.distributed.run import parse_args

    default = parse_args(["-m", "x"]).signals_to_handle  # type: ignore[no-untyped-call]
    assert signals_to_handle(["--standalone", "-m", "x"]) == default
    assert default == LaunchConfig(1, 1, 1).signals_to_handle
    assert signals_to_handle(["--signals-to-handle=SIGTERM"]) == "SIGTERM"
    assert signals_to_handle(["--signals_to_handle", "SIGINT", "-m", "x"]) == "SIGINT"


def test_a_bad_agent_command_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness.launch.agent", "-m", "x"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "dcpqual agent: error: usage: python -m harness.launch.agent [--preload M,M] -- "
        "TORCHRUN_ARGS"
    ]
