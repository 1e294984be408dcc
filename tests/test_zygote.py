"""The rank zygote and its fork stub: a forked rank is what torchrun would have started, and the
stub stands for it towards torchrun (exit code, death by signal, forwarded signals); a dead stub
takes its rank with it, a dead zygote is one clear line and exit 1, and a zygote that refuses to
fork leaves each stub to start its rank cold."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.rank import parentage
from harness.rank.forkwire import SOCKET_ENV, ZYGOTE_PID_ENV, refusal_path
from harness.rank.zygotelog import Forked, NotPreloaded, Ready, read_events

REPO = Path(__file__).resolve().parents[1]

RANK = """
import os, signal, sys, time
mode = sys.argv[1]
out = sys.argv[2]
def note(text):
    with open(out + ".tmp", "w") as f:
        f.write(text)
    os.rename(out + ".tmp", out)
if mode == "exit":
    from harness.rank.parentage import parentage
    above = parentage()
    note(repr((sys.argv, os.getcwd(), sys.path[0], os.environ.get("PROBE"),
               (above.agent, above.stub, above.zygote == os.getppid(), os.getpid()),
               os.getsid(0) == os.getpid())))
    sys.exit(int(sys.argv[3]))
if mode == "signal":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "interrupt":  # what an uncaught Ctrl-C does, after the interpreter's atexit
    import atexit
    atexit.register(note, "atexit ran")
    raise KeyboardInterrupt
if mode == "import":  # imports a module, notes what the environment says after
    __import__(sys.argv[3])
    note(repr([os.environ.get(k) for k in ("PRELOAD_SET", "PRELOAD_DEFAULT", "PRELOAD_GONE")]))
    sys.exit(0)
if mode == "unflushed":  # a file left open, its bytes still in its buffer, as the rank ends
    left_open = open(out, "w")
    left_open.write("written, never flushed")
    sys.exit(0)
if mode == "warned":  # its import warns in a cold rank
    import warnmod
    sys.exit(0)
if mode == "startup":  # what the interpreter's start decided, as the rank sees it
    import __main__, multiprocessing
    from harness.rank.parentage import parentage
    note(repr((sys.orig_argv, sys.executable, sys.argv[0], __main__.__dict__.get("__file__"),
               "Zygote" in vars(__main__), multiprocessing.current_process().authkey.hex(),
               parentage().forked)))
    sys.exit(0)
if mode == "term":
    def on_term(signum, frame):
        note("got SIGTERM")
        sys.exit(42)
    signal.signal(signal.SIGTERM, on_term)
if mode == "helper":  # a helper process in the rank's own group, as a test's subprocess is
    import subprocess
    helper = subprocess.Popen(["sleep", "600"])
    note(f"{os.getpid()} {helper.pid}")
    time.sleep(600)
note(str(os.getpid()))
time.sleep(600)
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


# A module whose import warns, as torch's import may: a cold rank prints that on its stderr.
WARNMOD = "import warnings\nwarnings.warn('warnmod was imported', UserWarning)\n"
PRELOADED = "json,multiprocessing,warnmod"


# A module whose import leaves bytes in a file's buffer, in the process that imported it.
LEAKMOD = (
    "import os\nlog = open(os.environ['LEAK_LOG'], 'a')\nlog.write(f'written by {os.getpid()}; ')\n"
)


# A module whose import raises, as a vLLM built against another torch does.
BROKENMOD = "raise ImportError('brokenmod was built against another torch')\n"
# A module whose import writes os.environ, as `import vllm` does.
ENVMOD = (
    "import os\nos.environ['PRELOAD_SET'] = 'by the import'\n"
    "os.environ.setdefault('PRELOAD_DEFAULT', 'by the import')\n"
    "os.environ.pop('PRELOAD_GONE', None)\n"
)


@contextlib.contextmanager
def _zygote(tmp_path: Path, modules: str, **env: str):
    """A zygote preloading `modules` (the protocol does not need torch), once it is ready."""
    sock = tmp_path / "z.sock"
    log = tmp_path / "zygote.log"
    helpers = (
        ("warnmod", WARNMOD),
        ("brokenmod", BROKENMOD),
        ("envmod", ENVMOD),
        ("leakmod", LEAKMOD),
    )
    for name, text in helpers:
        (tmp_path / f"{name}.py").write_text(text)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "harness.rank.zygote", str(sock), modules],
            cwd=tmp_path,
            env=_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while not any(isinstance(e, Ready) for e in read_events(log.read_bytes())):
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "zygote not ready"
        time.sleep(0.05)
    (tmp_path / "rankmod.py").write_text(RANK)
    try:
        yield proc, sock
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture
def zygote(tmp_path: Path):
    """A zygote preloading only what PRELOADED names, and its socket."""
    with _zygote(tmp_path, PRELOADED) as both:
        yield both


def _stub(
    tmp_path: Path,
    sock: Path,
    zproc,
    *args: str,
    session: bool = False,
    options: tuple[str, ...] = ("-u",),
    module: tuple[str, ...] = ("-m", "rankmod"),
    **env: str,
) -> subprocess.Popen[bytes]:
    """A stub as torchrun starts it (`session`: in its own session, as torchrun does; `options`:
    its interpreter's, torchrun's `-u`); its stderr goes to `stub.err`."""
    with (tmp_path / "stub.err").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, *options, "-m", "harness.rank.forkstub", "--", *module, *args],
            cwd=tmp_path,
            env=_env(**{SOCKET_ENV: str(sock), ZYGOTE_PID_ENV: str(zproc.pid)}, **env),
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=session,
        )


def _wait_for(path: Path, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return path.read_text()


def _sleeping_rank(tmp_path: Path, sock: Path, zproc) -> tuple[subprocess.Popen[bytes], int]:
    """A stub whose forked rank sleeps, and that rank's pid once it has written it."""
    out = tmp_path / "pid"
    stub = _stub(tmp_path, sock, zproc, "sleep", str(out))
    return stub, int(_wait_for(out))


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _ended(pid: int, timeout_s: float = 10.0) -> bool:
    """Gone or a zombie (dead, its parent not reaping it yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_the_stub_exits_with_the_ranks_code_and_the_rank_has_the_stubs_world(tmp_path, zygote):
    zproc, sock = zygote
    out = tmp_path / "seen"
    stub = _stub(tmp_path, sock, zproc, "exit", str(out), "3", PROBE="yes")
    assert stub.wait(30) == 3
    argv, cwd, path0, probe, (agent, stub_pid, zygote_parent, pid), own_session = eval(
        out.read_text()
    )
    assert argv == [str(tmp_path / "rankmod.py"), "exit", str(out), "3"]
    assert (cwd, path0, probe) == (str(tmp_path), str(tmp_path), "yes")
    # The stub's parent (here this test, there torchrun) is the rank's agent, not its parent.
    assert (agent, stub_pid, zygote_parent) == (os.getpid(), stub.pid, True)
    assert pid != stub.pid
    assert own_session
    events = read_events((tmp_path / "zygote.log").read_bytes())
    assert [(e.pid, e.stub) for e in events if isinstance(e, Forked)] == [(pid, stub.pid)]


def test_the_zygote_logs_each_ranks_fork_and_reaping_for_the_launcher(tmp_path, zygote):
    from harness.launch.plan import ZygotePlan
    from harness.launch.zygote import ZygoteRun

    zproc, sock = zygote
    out = tmp_path / "seen"
    stub = _stub(tmp_path, sock, zproc, "exit", str(out), "0", RANK="3")
    assert stub.wait(30) == 0
    pid = eval(out.read_text())[4][3]
    run = ZygoteRun(ZygotePlan(argv=(), socket=sock), tmp_path / "zygote.log")
    deadline = time.monotonic() + 10
    while not run.reaped() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.reaped() == {(3, pid)}


def _cold(tmp_path: Path, *args: str) -> int:
    """The rank's module run as torchrun would run it without a zygote: its exit status."""
    return subprocess.run(
        [sys.executable, "-u", "-m", "rankmod", *args], cwd=tmp_path, env=_env(), timeout=60
    ).returncode


def test_an_uncaught_keyboardinterrupt_ends_the_rank_by_sigint_as_it_ends_a_cold_one(
    tmp_path, zygote
):
    zproc, sock = zygote
    out = tmp_path / "interrupted"
    stub = _stub(tmp_path, sock, zproc, "interrupt", str(out))
    assert stub.wait(30) == -signal.SIGINT, (tmp_path / "stub.err").read_text()
    assert out.read_text() == "atexit ran"
    assert "KeyboardInterrupt" in (tmp_path / "stub.err").read_text()
    out.unlink()
    assert _cold(tmp_path, "interrupt", str(out)) == -signal.SIGINT  # what the stub matches
    assert out.read_text() == "atexit ran"


def test_a_file_the_rank_left_open_keeps_what_it_wrote_as_a_cold_ranks_does(tmp_path, zygote):
    """A cold interpreter's exit closes, so flushes, the files its modules still hold; a forked
    rank ends with `os._exit`, which would drop those bytes."""
    zproc, sock = zygote
    out = tmp_path / "left-open"
    assert _cold(tmp_path, "unflushed", str(out)) == 0
    assert out.read_text() == "written, never flushed"  # what the forked rank must match
    out.unlink()
    stub = _stub(tmp_path, sock, zproc, "unflushed", str(out))
    assert stub.wait(30) == 0, (tmp_path / "stub.err").read_text()
    assert any(isinstance(e, Forked) for e in read_events((tmp_path / "zygote.log").read_bytes()))
    assert out.read_text() == "written, never flushed"


def test_no_forked_rank_writes_what_the_zygotes_preload_left_in_a_buffer(tmp_path):
    """The zygote's own unflushed bytes are written once, by the zygote: each rank's copy of
    that buffer would otherwise reach the file as the rank ends, bytes no rank wrote."""
    log = tmp_path / "leak.log"
    with _zygote(tmp_path, "json,leakmod", LEAK_LOG=str(log)) as (zproc, sock):
        for _ in range(2):
            stub = _stub(tmp_path, sock, zproc, "exit", str(tmp_path / "seen"), "0")
            assert stub.wait(30) == 0, (tmp_path / "stub.err").read_text()
        assert log.read_text() == f"written by {zproc.pid}; "


def test_what_the_preload_warned_is_on_each_forked_ranks_stderr_as_on_a_cold_ones(tmp_path, zygote):
    zproc, sock = zygote
    err = tmp_path / "stub.err"
    for _ in range(2):
        assert _stub(tmp_path, sock, zproc, "warned", str(tmp_path / "x")).wait(30) == 0
        assert err.read_text().count("UserWarning: warnmod was imported") == 1, err.read_text()
    cold = subprocess.run(
        [sys.executable, "-u", "-m", "rankmod", "warned", "x"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cold.stderr == err.read_text()


def test_a_preloaded_module_that_fails_to_import_fails_in_each_rank_as_cold_not_the_zygote(
    tmp_path,
):
    with _zygote(tmp_path, "json,brokenmod,warnmod") as (zproc, sock):
        events = read_events((tmp_path / "zygote.log").read_bytes())
        assert (
            NotPreloaded("brokenmod", "ImportError: brokenmod was built against another torch")
            in events
        )
        assert next(e for e in events if isinstance(e, Ready)).modules == ("json", "warnmod")
        stub = _stub(tmp_path, sock, zproc, "import", str(tmp_path / "x"), "brokenmod")
        assert stub.wait(30) == 1
        assert "ImportError: brokenmod was built" in (tmp_path / "stub.err").read_text()
        assert any(
            isinstance(e, Forked) for e in read_events((tmp_path / "zygote.log").read_bytes())
        )
        assert _cold(tmp_path, "import", str(tmp_path / "x"), "brokenmod") == 1
        assert zproc.poll() is None


def test_what_the_preload_wrote_into_the_environment_reaches_each_forked_rank(tmp_path):
    """As the rank's own import would have: set, setdefault (the rank's value kept), removed."""
    rank_env = {"PRELOAD_DEFAULT": "the rank's", "PRELOAD_GONE": "the rank's"}
    with _zygote(tmp_path, "json,envmod", PRELOAD_GONE="the zygote's") as (zproc, sock):
        out = tmp_path / "forked"
        stub = _stub(tmp_path, sock, zproc, "import", str(out), "envmod", **rank_env)
        assert stub.wait(30) == 0, (tmp_path / "stub.err").read_text()
        assert any(
            isinstance(e, Forked) for e in read_events((tmp_path / "zygote.log").read_bytes())
        )
    cold = tmp_path / "cold"
    assert (
        subprocess.run(
            [sys.executable, "-u", "-m", "rankmod", "import", str(cold), "envmod"],
            cwd=tmp_path,
            env=_env(**rank_env),
            timeout=60,
        ).returncode
        == 0
    )
    assert eval(out.read_text()) == eval(cold.read_text()) == ["by the import", "the rank's", None]


@pytest.mark.parametrize(
    ("filters", "code"), [("error", 1), ("ignore::UserWarning", 0)], ids=["error", "ignored"]
)
def test_what_the_preload_warned_meets_the_ranks_pytest_filters_as_a_cold_ranks_import(
    tmp_path, zygote, filters, code
):
    """A pytest rank imports its plugins under the ini's filters: `error` fails the forked rank
    where it fails the cold one (negative control), `ignore` passes both."""
    zproc, sock = zygote
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nfilterwarnings = {filters}\n")
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")
    (tmp_path / "plugmod.py").write_text("import warnmod\n")
    args = ("-m", "pytest", "-q", "-p", "harness.rank.heap", "-p", "plugmod", "test_ok.py")
    stub = _stub(tmp_path, sock, zproc, module=args)
    forked = stub.wait(60)
    err = (tmp_path / "stub.err").read_text()
    cold = subprocess.run(
        [sys.executable, "-u", *args],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert any(isinstance(e, Forked) for e in read_events((tmp_path / "zygote.log").read_bytes()))
    assert (forked != 0) == (cold.returncode != 0) == bool(code), (err, cold.stderr)
    if code:
        assert "UserWarning: warnmod was imported" in err
        assert "UserWarning: warnmod was imported" in cold.stdout + cold.stderr


def test_a_forked_rank_has_its_own_startup_argv_main_and_authkey(tmp_path, zygote):
    """sys.orig_argv, sys.executable, __main__ as a cold `python -u -m rankmod` has them, and a
    multiprocessing authkey of its own (the zygote's was drawn once, at its import)."""
    zproc, sock = zygote
    seen = []
    for n in range(2):
        out = tmp_path / f"forked{n}"
        assert _stub(tmp_path, sock, zproc, "startup", str(out)).wait(30) == 0
        seen.append(eval(out.read_text()))
    out = tmp_path / "cold"
    assert _cold(tmp_path, "startup", str(out)) == 0
    cold = eval(out.read_text())
    for n, forked in enumerate(seen):
        orig_argv, executable, argv0, main_file, zygotes_main, _key, was_forked = forked
        assert was_forked, "the rank was not forked: nothing to compare"
        assert orig_argv == [*cold[0][:-1], str(tmp_path / f"forked{n}")]
        assert (executable, argv0, main_file, zygotes_main) == (*cold[1:4], False)
    assert seen[0][5] != seen[1][5], "two forked ranks share one multiprocessing authkey"


def test_each_forked_rank_draws_its_own_torch_seed_as_a_cold_one_does(tmp_path):
    """torch seeds its default generator once per interpreter, at its import (in the zygote):
    two ranks forked from one zygote must not share that seed, as two cold ranks do not."""
    sock = tmp_path / "z.sock"
    zproc = subprocess.Popen(
        [sys.executable, "-u", "-m", "harness.rank.zygote", str(sock), "torch"],
        env=_env(OMP_NUM_THREADS="1"),
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    (tmp_path / "seeded.py").write_text(
        "import torch\nfrom harness.rank.parentage import parentage\n"
        "print(torch.initial_seed(), parentage().forked)\n"
    )
    try:
        seen = []
        for _ in range(2):
            stub = subprocess.run(
                [sys.executable, "-u", "-m", "harness.rank.forkstub", "--", "-m", "seeded"],
                cwd=tmp_path,
                env=_env(**{SOCKET_ENV: str(sock), ZYGOTE_PID_ENV: str(zproc.pid)}),
                capture_output=True,
                timeout=120,
                text=True,
            )
            assert stub.returncode == 0, stub.stderr
            seed, forked = stub.stdout.split()
            assert forked == "True", "the rank was not forked: nothing to compare"
            seen.append(seed)
        assert seen[0] != seen[1], "two forked ranks share the zygote's torch seed"
    finally:
        zproc.kill()
        zproc.wait()


def test_a_rank_whose_interpreter_would_start_otherwise_is_started_cold(tmp_path, zygote):
    """`-X dev` (an option, and sys.flags.dev_mode) cannot be given to a forked rank: the
    zygote says why and the stub starts the rank's own interpreter."""
    from harness.rank.zygotelog import SentCold

    zproc, sock = zygote
    out = tmp_path / "seen"
    stub = _stub(tmp_path, sock, zproc, "startup", str(out), options=("-u", "-X", "dev"))
    assert stub.wait(60) == 0, (tmp_path / "stub.err").read_text()
    orig_argv, *_, was_forked = eval(out.read_text())
    assert not was_forked
    assert orig_argv[1:5] == ["-u", "-X", "dev", "-m"]
    said = [
        e for e in read_events((tmp_path / "zygote.log").read_bytes()) if isinstance(e, SentCold)
    ]
    assert [e.stub for e in said] == [stub.pid]
    assert "sys.options" in said[0].reason and "dev_mode" in said[0].reason


def test_a_rank_killed_by_a_signal_kills_its_stub_with_the_same_signal(tmp_path, zygote):
    zproc, sock = zygote
    stub = _stub(tmp_path, sock, zproc, "signal", str(tmp_path / "x"))
    assert stub.wait(30) == -signal.SIGKILL


def test_sigterm_to_the_stub_reaches_the_rank_and_its_exit_code_comes_back(tmp_path, zygote):
    zproc, sock = zygote
    out = tmp_path / "term"
    stub = _stub(tmp_path, sock, zproc, "term", str(out))
    _wait_for(out)
    stub.send_signal(signal.SIGTERM)
    assert stub.wait(30) == 42
    assert out.read_text() == "got SIGTERM"


def test_a_rank_without_a_handler_dies_of_the_forwarded_sigterm_and_so_does_its_stub(
    tmp_path, zygote
):
    zproc, sock = zygote
    stub, rank = _sleeping_rank(tmp_path, sock, zproc)
    stub.send_signal(signal.SIGTERM)
    assert stub.wait(30) == -signal.SIGTERM
    assert _gone(rank)


def test_a_sigkilled_stub_takes_its_rank_with_it(tmp_path, zygote):
    zproc, sock = zygote
    stub, rank = _sleeping_rank(tmp_path, sock, zproc)
    stub.kill()
    stub.wait(30)
    assert _gone(rank), "the forked rank outlived its SIGKILLed stub"
    assert zproc.poll() is None  # the zygote serves on


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_torchruns_stop_of_the_stubs_group_reaches_the_ranks_helper_processes(
    tmp_path, zygote, sig
):
    """torchrun stops a worker with killpg of its group, which ends a cold rank's helper
    processes with it. A forked rank leads a group of its own: the stub forwards SIGTERM there,
    and the zygote, seeing a SIGKILLed stub gone, SIGKILLs that group."""
    zproc, sock = zygote
    out = tmp_path / "pids"
    stub = _stub(tmp_path, sock, zproc, "helper", str(out), session=True)
    rank, helper = map(int, _wait_for(out).split())
    try:
        assert os.getpgid(helper) == rank != os.getpgid(stub.pid)
        os.killpg(stub.pid, sig)
        assert stub.wait(30) == -sig
        assert _ended(rank), "the forked rank outlived its stub's stop"
        assert _ended(helper), "the rank's helper process outlived torchrun's stop of its stub"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper, signal.SIGKILL)


def test_a_dead_zygote_is_one_clear_line_exit_1_and_the_rank_ended(tmp_path, zygote):
    zproc, sock = zygote
    stub, rank = _sleeping_rank(tmp_path, sock, zproc)
    zproc.kill()
    zproc.wait()
    assert stub.wait(30) == 1
    err = (tmp_path / "stub.err").read_text()
    assert "rank zygote" in err and "went away" in err and f"rank pid {rank}" in err
    assert _gone(rank)


def test_a_stub_gives_up_at_once_on_a_zygote_that_is_gone(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stub = subprocess.run(
        [sys.executable, "-m", "harness.rank.forkstub", "--", "-m", "json.tool"],
        env=_env(**{SOCKET_ENV: str(tmp_path / "none.sock"), ZYGOTE_PID_ENV: str(dead.pid)}),
        capture_output=True,
        timeout=30,
    )
    assert stub.returncode == 1
    assert b"cannot reach the rank zygote" in stub.stderr


# A listener at the socket path that is not the launcher's zygote: what it would get and do
# if the stub trusted it (the rank's secrets, its stdout, a status of its choosing).
FAKE = """
import os, socket, sys
from harness.rank.forkwire import recv_request, send_reply
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(4)
c, _ = s.accept()
c.settimeout(30)
try:
    req, fds = recv_request(c)
    print("GOT", sorted(k for k in req.env if "TOKEN" in k), flush=True)
    os.write(fds[1], b"PASSED (written by the fake zygote)\\n")
    send_reply(c, pid=os.getpid())
    send_reply(c, status=0)
except Exception as exc:
    print("NOTHING", type(exc).__name__, flush=True)
"""


def test_a_stub_hands_nothing_to_a_listener_that_is_not_its_zygote(tmp_path):
    """Whoever bound the socket path first is asked who it is (SO_PEERCRED): not the pid the
    launcher started, so it gets no environment, no descriptors, and no say in the exit."""
    (tmp_path / "fake.py").write_text(FAKE)
    sock = tmp_path / "f.sock"
    fake = subprocess.Popen(
        [sys.executable, str(tmp_path / "fake.py"), str(sock)],
        env=_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        stub = subprocess.run(
            [sys.executable, "-u", "-m", "harness.rank.forkstub", "--", "-m", "json.tool"],
            env=_env(**{SOCKET_ENV: str(sock), ZYGOTE_PID_ENV: str(os.getpid())}, HF_TOKEN="x"),
            capture_output=True,
            timeout=60,
            text=True,
        )
        said, _ = fake.communicate(timeout=60)
    finally:
        fake.kill()
        fake.wait()
    assert stub.returncode == 1, stub.stderr
    assert "is not the rank zygote" in stub.stderr and f"pid {fake.pid}" in stub.stderr
    assert "PASSED" not in stub.stdout
    assert said.startswith("NOTHING"), said


THREADMOD = (
    "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
)


def test_a_zygote_with_a_thread_alive_refuses_to_serve(tmp_path):
    (tmp_path / "threadmod.py").write_text(THREADMOD)
    sock = tmp_path / "z.sock"
    done = subprocess.run(
        [sys.executable, "-m", "harness.rank.zygote", str(sock), "threadmod"],
        env=_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}"),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert b"cannot fork ranks" in done.stdout and b"threads alive" in done.stdout
    assert not sock.exists()
    assert "threads alive" in Path(refusal_path(str(sock))).read_text()


def test_the_stubs_of_a_zygote_that_refused_start_their_ranks_cold(tmp_path):
    """A refusal is no failure: each stub becomes its rank (exec, the same pid torchrun
    started), with the rank's argv and torchrun's `-u`, and without the zygote's variables."""
    (tmp_path / "threadmod.py").write_text(THREADMOD)
    (tmp_path / "cold.py").write_text(
        "import json, os, sys\n"
        "from harness.rank.parentage import parentage\n"
        "print(json.dumps([os.getpid(), parentage().forked, sys.argv[1:], sys.orig_argv[1:4],"
        f" os.environ.get({SOCKET_ENV!r})]))\n"
        "sys.exit(5)\n"
    )
    sock = tmp_path / "z.sock"
    zproc = subprocess.Popen(
        [sys.executable, "-m", "harness.rank.zygote", str(sock), "threadmod"],
        env=_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}"),
        stdout=subprocess.DEVNULL,
    )
    stub = subprocess.Popen(  # started before the zygote refused: it waits, then goes cold
        [sys.executable, "-u", "-m", "harness.rank.forkstub", "--", "-m", "cold", "a", "b"],
        cwd=tmp_path,
        env=_env(**{SOCKET_ENV: str(sock), ZYGOTE_PID_ENV: str(zproc.pid)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = stub.communicate(timeout=120)
    assert zproc.wait(30) == 3
    assert stub.returncode == 5, err
    pid, forked, argv, command, socket_env = json.loads(out)
    assert (pid, forked, argv, socket_env) == (stub.pid, False, ["a", "b"], None)
    assert command == ["-u", "-m", "cold"]


def test_a_stale_refusal_note_does_not_send_the_ranks_cold(tmp_path):
    """A note an earlier zygote left at this socket path (its launcher killed before it could
    remove it, or a file planted at the path) is not this zygote's word: the zygote removes it
    before its preload, and the stub believes only a note with its zygote's pid."""
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(1.5)\n")
    (tmp_path / "where.py").write_text(
        "import json\nfrom harness.rank.parentage import parentage\n"
        "print(json.dumps(parentage().forked))\n"
    )
    sock = tmp_path / "z.sock"
    note = Path(refusal_path(str(sock)))
    note.write_text(f"pid {os.getpid()}\ncannot fork ranks after the preload: STALE\n")
    path = f"{tmp_path}{os.pathsep}{REPO}"
    zproc = subprocess.Popen(
        [sys.executable, "-u", "-m", "harness.rank.zygote", str(sock), "slowmod"],
        env=_env(PYTHONPATH=path),
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        stub = subprocess.Popen(  # at once: the zygote is still preloading
            [sys.executable, "-u", "-m", "harness.rank.forkstub", "--", "-m", "where"],
            cwd=tmp_path,
            env=_env(**{SOCKET_ENV: str(sock), ZYGOTE_PID_ENV: str(zproc.pid)}, PYTHONPATH=path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        time.sleep(0.5)  # the zygote has removed the old note by now: plant one again
        note.write_text("pid 1\ncannot fork ranks after the preload: PLANTED\n")
        out, err = stub.communicate(timeout=120)
        assert stub.returncode == 0, err
        assert json.loads(out) is True, "the rank started cold on a note that was not its zygote's"
    finally:
        zproc.kill()
        zproc.wait()


def _catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (its SigCgt mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_before_the_zygote_is_ready_ends_the_stub_as_it_would_a_cold_rank(tmp_path, sig):
    """A cold rank still importing torch dies of torchrun's SIGTERM (or Ctrl-C) at once; the
    stub of a zygote still preloading does the same, and no rank is forked for it later."""
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(4)\n")
    (tmp_path / "rankmod.py").write_text(RANK)
    sock = tmp_path / "z.sock"
    log = tmp_path / "zygote.log"
    with log.open("wb") as out:
        zproc = subprocess.Popen(
            [sys.executable, "-u", "-m", "harness.rank.zygote", str(sock), "slowmod"],
            cwd=tmp_path,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        stub = _stub(tmp_path, sock, zproc, "sleep", str(tmp_path / "pid"))
        deadline = time.monotonic() + 30
        while not _catches(stub.pid, signal.SIGUSR1):  # its handlers are in: it waits
            assert stub.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        assert not sock.exists(), "the zygote was ready too soon for this test"
        stub.send_signal(sig)
        assert stub.wait(2) == -sig
        deadline = time.monotonic() + 30
        while not any(isinstance(e, Ready) for e in read_events(log.read_bytes())):
            assert zproc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        zproc.kill()
        zproc.wait()
    assert not any(isinstance(e, Forked) for e in read_events(log.read_bytes()))


def test_the_stub_imports_only_the_standard_library():
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import harness.rank.forkstub"],
        env=_env(),
        capture_output=True,
        timeout=60,
        text=True,
    )
    names = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    ours = {n for n in names if n.split(".")[0] == "harness"}
    assert ours == {"harness", "harness.rank", "harness.rank.forkwire", "harness.rank.forkstub"}
    assert not {"torch", "pytest", "numpy", "pydantic", "psutil"} & names


def test_a_ranks_agent_is_its_parent_unless_the_zygote_forked_it(monkeypatch):
    monkeypatch.setattr(parentage, "_forked", None)
    assert parentage.agent_pid() == os.getppid()  # started by torchrun itself
    assert parentage.parentage().between() == {}
    forked = parentage.Parentage(agent=33, stub=22, zygote=os.getppid())
    parentage.set_forked(forked)
    assert parentage.agent_pid() == 33
    assert set(parentage.parentage().between()) == {22, os.getppid()}


def test_a_forked_rank_gets_torchs_thread_count_from_its_own_environment(tmp_path):
    """With the real preload (torch): torch read OMP_NUM_THREADS in the zygote; the rank's own
    value is applied after the fork, and the agent pid is the stub's parent."""
    sock = tmp_path / "z.sock"
    log = tmp_path / "zygote.log"
    with log.open("wb") as out:
        zproc = subprocess.Popen(
            [sys.executable, "-u", "-m", "harness.rank.zygote", str(sock), "torch"],
            env=_env(OMP_NUM_THREADS="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        (tmp_path / "threads.py").write_text(
            textwrap.dedent(
                """
                import os, sys, torch
                from harness.rank.parentage import agent_pid
                print(torch.get_num_threads(), agent_pid())
                """
            )
        )
        stub = subprocess.run(
            [sys.executable, "-m", "harness.rank.forkstub", "--", "-m", "threads"],
            cwd=tmp_path,
            env=_env(
                **{SOCKET_ENV: str(sock), ZYGOTE_PID_ENV: str(zproc.pid)}, OMP_NUM_THREADS="2"
            ),
            capture_output=True,
            timeout=120,
            text=True,
        )
        assert stub.returncode == 0, stub.stderr + log.read_text()
        assert stub.stdout.split() == ["2", str(os.getpid())]
    finally:
        zproc.kill()
        zproc.wait()
