"""A rank's output reaches its log files scrubbed as it is written: through the relay the rank
forks at start, whatever writes it (Python's streams, a raw descriptor, a subprocess) and however
the rank ends (an `os._exit` mid-line, a SIGTERM to its whole group). And the launcher does not
count a relay that finishes its rank's last lines as a process the run left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from _support.runs import wait_until

from harness.core.secrets import SCRUBBED
from harness.launch import ending
from harness.launch.proctree import identify
from harness.rank.outrelay import OUTPUT_SECRETS_ENV, RELAY_NAME

REPO = Path(__file__).resolve().parents[1]
TOKEN = "hf_outrelay0123456789abcdefXYZ"
TYPED = "typed-on-the-command-line-42x"

RANK = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from pathlib import Path
    import psutil
    from harness.rank import outrelay

    side = Path(sys.argv[1])
    if sys.argv[4] == "many-fds":  # the relay's pipes get descriptors above 1024
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
        held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    outrelay.pytest_addhooks(None)  # what registering the plugin does on a rank
    relay = [child.pid for child in psutil.Process().children()]
    comm = ""
    for _ in range(500 if relay else 0):  # it names itself as it starts
        comm = Path(f"/proc/{relay[0]}/comm").read_text().strip()
        if comm == outrelay.RELAY_NAME:
            break
        time.sleep(0.01)
    side.write_text(f"{relay[0] if relay else 0} {comm}")
    token = os.environ["HF_TOKEN"]
    half = len(token) // 2
    sys.stdout.write("split " + token[:half]); sys.stdout.flush()
    time.sleep(0.2)
    sys.stdout.write(token[half:] + " end\\n"); sys.stdout.flush()
    os.write(2, ("raw " + token + "\\n").encode())
    subprocess.run(["sh", "-c", 'echo "child $HF_TOKEN"'], check=True)
    print("typed", sys.argv[2], flush=True)
    sys.stdout.write("last words " + token); sys.stdout.flush()
    if sys.argv[3] == "term":
        os.killpg(0, signal.SIGTERM)
        time.sleep(5)
    os._exit(3)
    """
)


def run_rank(
    tmp_path: Path, *, relay: bool, ending_by: str = "exit", fds: str = "few"
) -> tuple[str, str, str]:
    """Run RANK with its stdout and stderr in files, as torchrun gives a rank its log files;
    returns (stdout file, stderr file, what it noted about its relay) once the relay ended."""
    env = {**os.environ, "HF_TOKEN": TOKEN, "PYTHONPATH": str(REPO)}
    env.pop(OUTPUT_SECRETS_ENV, None)
    if relay:
        env[OUTPUT_SECRETS_ENV] = json.dumps([TYPED])
    side = tmp_path / "side.txt"
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.run(
            [sys.executable, "-c", RANK, str(side), TYPED, ending_by, fds],
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # its own group: the SIGTERM it sends reaches no one else
            timeout=60,
        )
    assert proc.returncode in (3, -15)
    relay_pid = int(side.read_text().split()[0])
    if relay_pid:
        assert wait_until(lambda: not psutil.pid_exists(relay_pid), 30), "the relay never ended"
    return out.read_text(), err.read_text(), side.read_text()


@pytest.mark.parametrize("fds", ["few", "many-fds"])
def test_what_a_rank_writes_reaches_its_files_scrubbed(tmp_path: Path, fds: str) -> None:
    stdout, stderr, noted = run_rank(tmp_path, relay=True, fds=fds)
    assert noted.split()[1] == RELAY_NAME
    assert TOKEN not in stdout + stderr and TYPED not in stdout
    assert f"split {SCRUBBED} end\n" in stdout
    assert f"child {SCRUBBED}\n" in stdout
    assert f"typed {SCRUBBED}\n" in stdout
    assert stdout.endswith(f"last words {SCRUBBED}")  # written after the rank's os._exit
    assert stderr == f"raw {SCRUBBED}\n"


def test_without_the_relay_the_same_rank_leaves_the_secret_in_its_files(tmp_path: Path) -> None:
    """The control: the launcher's variable is what starts the relay; without it, raw bytes."""
    stdout, stderr, noted = run_rank(tmp_path, relay=False)
    assert noted.split() == ["0"]
    assert f"split {TOKEN} end\n" in stdout and TOKEN in stderr


def test_the_relay_writes_the_last_line_of_a_rank_its_group_was_sent_sigterm(
    tmp_path: Path,
) -> None:
    stdout, _, _ = run_rank(tmp_path, relay=True, ending_by="term")
    assert stdout.endswith(f"last words {SCRUBBED}")


SLEEPER = (
    "import sys, time; open('/proc/self/comm', 'w').write(sys.argv[1]); "
    "time.sleep(float(sys.argv[2]))"
)


def sleeper(name: str, seconds: float) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, name, str(seconds)])
    assert wait_until(lambda: psutil.Process(proc.pid).name() == name, 10)
    return proc


def test_a_relay_is_a_process_a_rank_named_that_bears_the_relay_name() -> None:
    relay, other = sleeper(RELAY_NAME, 30), sleeper("python-helper", 30)
    try:
        found = {p.pid: p for p in map(identify, (relay.pid, other.pid)) if p is not None}
        every = list(found.values())
        assert ending.output_relays(every, {relay.pid, other.pid}) == [found[relay.pid]]
        assert ending.output_relays(every, {other.pid}) == []  # the name alone is no proof
        assert ending.output_relays(every, set()) == []
    finally:
        for proc in (relay, other):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("lives_s, ends", [(0.5, True), (30, False)], ids=["ends", "held-open"])
def test_the_launcher_waits_for_a_relay_to_end_but_only_a_while(lives_s: float, ends: bool) -> None:
    proc = sleeper(RELAY_NAME, lives_s)
    try:
        found = identify(proc.pid)
        assert found is not None
        started = time.monotonic()
        ending.let_relays_finish([found], timeout_s=3.0)
        took = time.monotonic() - started
        assert wait_until(lambda: proc.poll() is not None, 0.05) == ends, took
        assert took < 3.0 if ends else took >= 3.0
    finally:
        proc.kill()
        proc.wait()
