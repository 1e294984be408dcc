"""The zygote's pieces that need no process: its CUDA check (with a fake torch and fake memory
maps), its log lines (one format/parse pair), the startup facts a rank's stub sends, and who
each end takes the other for."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.core import preloaded
from harness.rank import zygote as zygote_module
from harness.rank.forkwire import (
    Request,
    Startup,
    interpreter_options,
    not_the_zygote,
    peer_of,
    send_request,
)
from harness.rank.preload import PreloadEnv
from harness.rank.zygote import Zygote, cuda_refusal, loaded_libraries
from harness.rank.zygotelog import (
    Forked,
    NotPreloaded,
    Ready,
    Reaped,
    Refused,
    SentCold,
    format_event,
    parse_event,
    read_events,
)

MAPS = """\
55d0c0a00000-55d0c0a2c000 r--p 00000000 08:01 1234 /usr/bin/python3.11
7f1c2a000000-7f1c2a200000 r-xp 00000000 08:01 2345 /opt/torch/lib/libtorch_cpu.so
7f1c2b000000-7f1c2b100000 r-xp 00000000 08:01 3456 /usr/local/cuda/lib64/libcudart.so.12
7f1c2c000000-7f1c2c021000 rw-p 00000000 00:00 0
7ffd5e1f0000-7ffd5e211000 rw-p 00000000 00:00 0 [stack]
"""
DRIVER = "7f1c2d000000-7f1c2d800000 r-xp 00000000 08:01 4567 /usr/lib/x86_64/libcuda.so.1\n"


def _torch(initialized: bool) -> SimpleNamespace:
    return SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: initialized))


@pytest.fixture
def maps(tmp_path: Path):
    def write(text: str) -> str:
        path = tmp_path / "maps"
        path.write_text(text)
        return str(path)

    return write


def test_a_zygote_that_never_touched_cuda_may_fork(maps) -> None:
    # The CUDA runtime and torch's own libraries are loaded by `import torch`: no refusal.
    assert cuda_refusal(_torch(False), maps(MAPS)) is None
    assert cuda_refusal(None, maps(MAPS)) is None


def test_a_loaded_cuda_driver_refuses_the_fork_though_torch_says_not_initialized(maps) -> None:
    """What `torch.cuda.is_available()` or `device_count()` leave: the driver loaded,
    `is_initialized()` still false."""
    reason = cuda_refusal(_torch(False), maps(MAPS + DRIVER))
    assert reason is not None and "/usr/lib/x86_64/libcuda.so.1" in reason
    deleted = DRIVER.replace("libcuda.so.1\n", "libcuda.so.550.54 (deleted)\n")
    assert cuda_refusal(None, maps(MAPS + deleted)) is not None


def test_torchs_own_word_that_cuda_is_initialized_refuses_the_fork(maps) -> None:
    reason = cuda_refusal(_torch(True), maps(MAPS))
    assert reason is not None and "initialized" in reason


def test_only_the_driver_itself_counts(maps) -> None:
    near = (
        MAPS
        + DRIVER.replace("libcuda.so.1", "libcudart.so.1")
        + DRIVER.replace("libcuda.so.1", "libcuda_stub.so")
    )
    assert loaded_libraries(("libcuda.so",), maps(near)) == []
    assert loaded_libraries(("libcuda.so",), "/nonexistent/maps") == []


def test_this_process_maps_are_read() -> None:
    """The real /proc/self/maps parses: the C library is in it."""
    assert loaded_libraries(("libc.so",)) != []


EVENTS = [
    Ready(pid=41, seconds=2.5, modules=("torch", "pytest", "harness.rank.agreement")),
    Ready(pid=41, seconds=0.0, modules=()),
    Forked(pid=100, stub=99, rank=7),
    Forked(pid=100, stub=99, rank=None),
    Reaped(pid=100, status=256),
    Reaped(pid=100, status=9),
    SentCold(stub=99, reason="its interpreter would have started otherwise: sys.flags.dev_mode 1"),
    Refused(reason="cannot fork ranks after the preload: 3 threads alive"),
    NotPreloaded(module="vllm", error="ImportError: undefined symbol: _ZN3c10"),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_each_log_line_reads_back_as_the_event_written(event) -> None:
    line = format_event(event)
    assert "\n" not in line
    assert parse_event(line) == event
    assert parse_event((line + "\n").encode()) == event


def test_a_reason_over_several_lines_is_logged_on_one() -> None:
    line = format_event(Refused("one\ntwo"))
    assert parse_event(line) == Refused("one two")


def test_other_lines_are_no_events() -> None:
    log = "\n".join(
        [
            "/opt/torch/__init__.py:1: UserWarning: something",
            format_event(EVENTS[2]),
            "dcpqual zygote: something new",
            "dcpqual zygote: forked pid x for stub 1 rank 0",
            format_event(EVENTS[4]),
        ]
    ).encode()
    assert read_events(log) == [EVENTS[2], EVENTS[4]]


def test_the_startup_a_stub_sends_reads_back_and_names_what_differs() -> None:
    here = Startup.here(["python", "-u", "-m", "x"], ["-u"])
    assert Startup.from_json(here.to_json()) == here
    assert here.differences(dataclasses.replace(here, orig_argv=("other",))) == []
    flags = list(here.flags)
    flags[0] += 1
    other = dataclasses.replace(here, options=(), flags=tuple(flags), path=(*here.path, "/x"))
    said = here.differences(other)
    assert len(said) == 3, said
    assert said[0].startswith("sys.options ['-u']") and "sys.path" in said[1]
    assert said[2].startswith(f"sys.flags.{type(sys.flags).__match_args__[0]} ")


def test_interpreter_options_are_those_before_the_module() -> None:
    argv = ["python", "-u", "-X", "dev", "-m", "harness.rank.forkstub", "--", "-m", "pytest"]
    assert interpreter_options(argv, "harness.rank.forkstub") == ["-u", "-X", "dev"]
    assert interpreter_options(argv, "pytest") == argv[1:7]
    assert interpreter_options(["python", "x.py"], "pytest") is None


def test_a_listener_of_another_pid_or_user_is_not_the_zygote() -> None:
    me = os.getuid()
    assert not_the_zygote((41, me), 41) is None
    assert "not the launcher's zygote (pid 41)" in (not_the_zygote((42, me), 41) or "")
    assert f"uid {me + 1}" in (not_the_zygote((41, me + 1), 41) or "")
    left, right = socket.socketpair()
    with left, right:
        assert peer_of(left) == (os.getpid(), me)


def test_the_zygote_neither_forks_for_nor_answers_another_user(tmp_path, monkeypatch) -> None:
    """A connection from another uid gets no reply (not even "cold") and no fork: its
    request is never read."""
    zygote = Zygote(str(tmp_path / "z.sock"))
    monkeypatch.setattr(zygote_module, "peer_of", lambda conn: (12345, os.getuid() + 1))
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(tmp_path / "z.sock"))
        send_request(client, Request(("-m", "x"), str(tmp_path), {}, 12345, 1))
        zygote._accept()
        client.settimeout(10)
        try:
            answer = client.recv(4096)
        except ConnectionResetError:  # closed with the request unread
            answer = b""
        assert answer == b"", "the zygote answered a stranger"
        assert zygote.ranks == []
    finally:
        client.close()
        zygote.close()


def test_the_preloads_environment_writes_are_made_in_the_ranks_own_environment() -> None:
    before = {"KEEP": "z", "CHANGED": "z", "GONE": "z"}
    after = {"KEEP": "z", "CHANGED": "import", "ADDED": "import", "DEFAULTED": "import"}
    diff = PreloadEnv.between(before, after)
    rank_env = {"CHANGED": "rank", "GONE": "rank", "DEFAULTED": "rank", "OWN": "rank"}
    env = dict(rank_env)
    diff.apply(env, rank_env)
    # the rank's own DEFAULTED (the zygote lacked it) stays; the import's writes win elsewhere
    assert env == {"CHANGED": "import", "ADDED": "import", "DEFAULTED": "rank", "OWN": "rank"}


def test_a_recorded_warning_is_reissued_once_under_the_callers_filters() -> None:
    import warnings

    with preloaded.recording() as log:
        warnings.warn("vllm drifted", FutureWarning, stacklevel=1)
        warnings.warn("quiet by default", DeprecationWarning, stacklevel=1)
    assert [m.category for m in log] == [FutureWarning, DeprecationWarning]
    preloaded.hand_over({preloaded.REAL_TREES: log})
    preloaded.reissue(preloaded.STARTUP)  # another group: nothing
    with warnings.catch_warnings(), pytest.raises(FutureWarning, match="vllm drifted"):
        warnings.simplefilter("error")
        preloaded.reissue(preloaded.REAL_TREES)
    assert not preloaded.pending(preloaded.REAL_TREES)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        preloaded.reissue(preloaded.REAL_TREES)
    assert again == []


def test_a_reissued_warning_meets_filters_that_name_its_module(tmp_path, monkeypatch) -> None:
    """As the ranks' `ignore:...:DeprecationWarning:torch.jit._script` names torch's module."""
    import importlib
    import warnings

    (tmp_path / "drifted_mod.py").write_text(
        "import warnings\nwarnings.warn('drifted', DeprecationWarning)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with preloaded.recording() as log:
        importlib.import_module("drifted_mod")
    monkeypatch.setitem(sys.modules, "drifted_mod", sys.modules["drifted_mod"])  # undone after
    preloaded.hand_over({preloaded.STARTUP: log})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "drifted", DeprecationWarning, "drifted_mod")
        preloaded.reissue(preloaded.STARTUP)


def test_dynamos_import_is_a_blind_spot_until_the_rank_reaches_where_it_imports_it(
    monkeypatch,
) -> None:
    """Preloaded with vLLM, torch._dynamo is loaded before a `--models both` run's stand-in
    windows: the dynamo detector says it cannot see its import there, until the real-tree
    build, where a cold rank imports it too (a cold rank: no blind spot at all)."""
    import types

    from harness.capture.detectors import IMPORT_BLIND, DynamoDetector

    monkeypatch.setitem(
        sys.modules,
        "torch._dynamo",
        sys.modules.get("torch._dynamo") or types.ModuleType("torch._dynamo"),
    )
    preloaded.hand_over({}, {})
    assert DynamoDetector().blind_spots() == ()
    preloaded.hand_over({}, {preloaded.REAL_TREES: frozenset({"vllm", "torch._dynamo"})})
    (spot,) = DynamoDetector().blind_spots()
    assert spot.name == IMPORT_BLIND and not spot.active and "preload" in spot.reason
    preloaded.reissue(preloaded.REAL_TREES)
    assert DynamoDetector().blind_spots() == ()
