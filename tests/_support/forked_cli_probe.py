"""`python -m _support.forked_cli_probe WHAT`: prints what a command can see of how it was
started, as JSON, and ends as WHAT says: `exit-3`, `exit-text`, or `leak` (a `sleep 2` left
holding its stdout)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys


def main(what: str) -> None:
    facts = {
        "process": multiprocessing.current_process().name,
        "start_method": multiprocessing.get_start_method(allow_none=True),
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "session_leader": os.getsid(0) == os.getpid(),
        "main": sys.modules["__main__"].__spec__.name,
        "argv": sys.argv[1:],
    }
    print(json.dumps(facts), flush=True)
    if what == "leak":
        subprocess.Popen(["sleep", "2"])  # inherits stdout, never waited for
    elif what == "exit-3":
        sys.exit(3)
    elif what == "exit-text":
        sys.exit("stopped by the probe")


if __name__ == "__main__":
    main(sys.argv[1])
