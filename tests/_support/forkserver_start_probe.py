"""Run as a script (a fresh, single-threaded interpreter): starts multiprocessing's forkserver,
forked from this process (`forked`) or as multiprocessing starts it (`exec`), and prints what
the server and a child it forked hold, as one JSON line. `exit CODE_TEXT` instead runs
`forkserver_start.fork_running` on the Python text and prints the child's exit status."""

from __future__ import annotations

import json
import os
import sys
import types
from typing import Any

MARKER = "dcpqual_only_in_the_parent_before_the_server_started"


def child_facts(send: Any) -> None:
    """In a child the forkserver forked: what it inherited."""
    from multiprocessing import forkserver

    send.send(
        {
            "marker": MARKER in sys.modules,
            "start_lock_free": forkserver._forkserver._lock.acquire(timeout=2),
        }
    )


def server_facts(how: str, held: str) -> dict[str, Any]:
    import multiprocessing
    from multiprocessing import forkserver

    from harness.launch.forkserver_start import forked_from_here

    sys.modules[MARKER] = types.ModuleType(MARKER)
    held_file = open(held, "w")  # noqa: SIM115  # open while the server starts
    os.set_inheritable(held_file.fileno(), True)
    forked: list[int] = []
    if how == "forked":
        with forked_from_here() as started:
            forkserver.ensure_running()
        forked = list(started)
    else:
        forkserver.ensure_running()
    server = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    with open(f"/proc/{server}/cmdline") as f:
        cmdline = f.read().split("\0")
    context = multiprocessing.get_context("forkserver")
    answer, send = context.Pipe(duplex=False)
    child = context.Process(target=child_facts, args=(send,))
    child.start()
    send.close()
    facts = answer.recv()
    child.join()
    fds = []  # read once the server serves (its start-up opens and closes fds)
    for fd in os.listdir(f"/proc/{server}/fd"):
        try:
            fds.append(os.readlink(f"/proc/{server}/fd/{fd}"))
        except FileNotFoundError:
            continue
    held_file.close()
    return {
        "server": server,
        "forked": forked,
        "server_cmdline_is_mine": cmdline[: len(sys.orig_argv)] == sys.orig_argv,
        "server_holds_the_file": held in fds,
        "child": facts,
        "child_exit": child.exitcode,
    }


def exit_status(text: str) -> dict[str, Any]:
    from harness.launch.forkserver_start import fork_running

    pid = fork_running(text, [])
    _, status = os.waitpid(pid, 0)
    return {"exit": os.waitstatus_to_exitcode(status)}


if __name__ == "__main__":
    mode, arg = sys.argv[1], sys.argv[2]
    facts = exit_status(arg) if mode == "exit" else server_facts(mode, arg)
    print(json.dumps(facts), flush=True)
